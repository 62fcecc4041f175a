"""Parquet files' fields beside image and label (converters.parquet, datapipe.formats.parquet): a
caption column as each record's text, a list-of-ids column (the Hub's Sequence(ClassLabel)) as its
multi-labels; converted and read in place alike. A caption column of another type is one line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from converters import ConvertOptions, convert
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.image.decode import check_image
from datapipe.records import Fields
from tests.conftest import BAD_FILES
from tests.parquet_data import IMAGE, TRAIN, fixture_rows

OPTIONS = dict(workers=2, progress=False, shard_bytes=64 << 10, checkpoint_every=4)
NAMES = ["sky", "tree", "water", "road"]
ROWS = [r for r in fixture_rows() if r[0] not in BAD_FILES and check_image(r[1]).data is r[1]][:9]  # stored as is
CAPTIONS = [f"photo {i}: café, 東京 🙂" + "\nline two" * (i == 1) if i % 4 else None for i in range(len(ROWS))]


def table(columns: dict[str, tuple[pa.DataType, list]], features: dict[str, dict] | None = None) -> pa.Table:
    """ROWS' images in an Image column, and `columns` (name -> (type, values)); the features, if
    given, in the schema's `huggingface` metadata."""
    fields = [("image", IMAGE)] + [(name, kind) for name, (kind, _) in columns.items()]
    meta = {b"huggingface": json.dumps({"info": {"features": {"image": {"_type": "Image"}, **features}}}).encode()} \
        if features else None
    data = {"image": [{"bytes": b, "path": Path(p).name} for p, b, _ in ROWS]}
    data |= {name: values for name, (_, values) in columns.items()}
    return pa.table(data, schema=pa.schema(fields, metadata=meta))


def records(ds) -> list[tuple[bytes, int, Fields]]:
    return [(r.data, r.label, r.fields) for r in sorted((ds.record(i) for i in range(len(ds))), key=lambda r: r.key)]


def converted_and_in_place(root: Path, tmp_path: Path, suffix: str) -> tuple[list, list, object]:
    dst = tmp_path / f"out{suffix}"
    convert(root, dst, ConvertOptions(**OPTIONS))
    return records(open_dataset(dst)), records(open_dataset(str(root / "*.parquet"))), read_manifest(dst)


@pytest.mark.parametrize("suffix", [".lmdb", ".wds"])
def test_a_caption_column_is_each_record_s_text_with_or_without_a_label(tmp_path, suffix):
    root = tmp_path / "data"
    root.mkdir()
    labels = [label for *_, label in ROWS]
    pq.write_table(table({"label": (pa.int64(), labels), "caption": (pa.string(), CAPTIONS)}), root / TRAIN,
                   row_group_size=4)
    want = [(b, label, Fields(CAPTIONS[i], None, None) if CAPTIONS[i] is not None else Fields())
            for i, (_, b, label) in enumerate(ROWS)]
    stored, in_place, manifest = converted_and_in_place(root, tmp_path, suffix)
    assert stored == in_place == want
    assert manifest.splits["train"].fields == ["text"] and open_dataset(str(root / "*.parquet")).fields == ("text",)
    pq.write_table(table({"text": (pa.large_string(), CAPTIONS)}), root / TRAIN)  # no label column: labels -1
    (tmp_path / "unlabelled").mkdir()
    stored, in_place, _ = converted_and_in_place(root, tmp_path / "unlabelled", suffix)
    assert stored == in_place == [(b, -1, fields) for b, _, fields in want]


def test_a_sequence_of_class_labels_is_each_record_s_multi_labels(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    ids = [[i % 4, (i + 2) % 4, i % 4] if i % 3 else [] for i in range(len(ROWS))]
    features = {"labels": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": NAMES}}}
    pq.write_table(table({"labels": (pa.list_(pa.int64()), ids)}, features), root / TRAIN, row_group_size=4)
    want = [(b, min(v, default=-1), Fields(labels=tuple(sorted(set(v))))) for (_, b, _), v in zip(ROWS, ids)]
    stored, in_place, manifest = converted_and_in_place(root, tmp_path, ".h5")
    assert stored == in_place == want
    assert manifest.classes == NAMES == open_dataset(str(root / "*.parquet")).classes  # the Hub's order, kept
    pq.write_table(table({"labels": (pa.list_(pa.int32()), ids)}), root / TRAIN)  # no metadata: ids as classes
    (tmp_path / "plain").mkdir()
    stored, in_place, manifest = converted_and_in_place(root, tmp_path / "plain", ".lmdb")
    assert stored == in_place == want and manifest.classes == ["0", "1", "2", "3"]


def test_a_multi_label_id_outside_the_classes_skips_its_row(tmp_path):
    ids = [[0, 1], [3, 9], [2]] + [[1]] * (len(ROWS) - 3)
    features = {"tags": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": NAMES}}}
    pq.write_table(table({"tags": (pa.list_(pa.int64()), ids)}, features), tmp_path / TRAIN)
    report = convert(tmp_path / TRAIN, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert report.splits["train"].skipped == [{"path": f"{TRAIN}#row 1",
                                                  "reason": "in its multi-label column 'tags', label 9 is not a class "
                                                            "id (0..3)"}]
    assert report.processed == len(ROWS) - 1


def test_a_caption_column_of_another_type_is_one_line_naming_it(tmp_path, capsys):
    pq.write_table(table({"label": (pa.int64(), [0] * len(ROWS)), "caption": (pa.int64(), list(range(len(ROWS))))}),
                   tmp_path / TRAIN)
    assert main(["convert", str(tmp_path / TRAIN), str(tmp_path / "out.wds")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("datapipe convert: error:")]
    assert len(errors) == 1 and re.search(rf"{TRAIN}: the caption column 'caption' holds int64, not strings",
                                          errors[0]), errors
    with pytest.raises(ValueError, match=r"the caption column 'caption' holds int64, not strings"):
        open_dataset(str(tmp_path / TRAIN))


def test_a_label_column_beside_a_list_of_ids_stays_the_label_and_names_the_classes(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    ids = [[0, 1], [1], [], [2], [3, 7]] + [[1, 0]] * (len(ROWS) - 5)  # 7: beyond the label column's classes
    pq.write_table(table({"label": (pa.int64(), [3] * len(ROWS)), "labels": (pa.list_(pa.int64()), ids)}),
                   root / TRAIN, row_group_size=4)
    report = convert(root, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert report.splits["train"].skipped == [{"path": f"{TRAIN}#row 4",
                                                  "reason": "in its multi-label column 'labels', label 7 is not a "
                                                            "class id (0..3)"}]
    want = [(b, 3, Fields(labels=tuple(sorted(v)))) for (_, b, _), v in zip(ROWS, ids)]
    in_place = open_dataset(str(root / "*.parquet"))
    assert records(open_dataset(tmp_path / "out.lmdb")) == want[:4] + want[5:]
    assert [(r.data, r.label, r.fields) for r in map(in_place.record, [0, 1, 2, 3, 5])] == want[:4] + want[5:6]
    assert read_manifest(tmp_path / "out.lmdb").classes == in_place.classes == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match=r"#row 4: in its multi-label column 'labels', label 7 is not a class id"):
        in_place.record(4)
    sequence = {"labels": {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": NAMES}}}
    columns = {"label": (pa.int64(), [0] * len(ROWS)), "labels": (pa.list_(pa.int64()), ids)}
    pq.write_table(table(columns, sequence), root / TRAIN)  # the label column unnamed: the sequence's names
    assert open_dataset(str(root / TRAIN)).classes == NAMES
    pq.write_table(table(columns, {**sequence, "label": {"_type": "ClassLabel", "names": NAMES[::-1]}}), root / TRAIN)
    with pytest.raises(ValueError, match=r"the label column 'label' and the multi-label column 'labels' name "
                                         r"different classes \(4 names against 4; the first difference: class 0 is "
                                         r"'road' in one, 'sky' in the other\); one list of classes serves both"):
        open_dataset(str(root / TRAIN))
