"""Parquet files from a careless or hostile author (issue #38), read in place and converted: a label
id past the cap of inferred classes, image columns of the wrong type, unsigned labels, validation
files whose class names are in another order, captions that are not UTF-8, file names that are not
UTF-8, a FIFO or a folder matched by `*.parquet`. Each is one line naming the file, a bad record
named and served around, or read correctly."""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from converters import ConvertOptions, convert, list_tasks
from datapipe import open_dataset, read_manifest
from datapipe.records import MAX_INFERRED_CLASSES
from tests.parquet_data import CLASSES, IMAGE, TRAIN, VAL, fixture_rows, hub_table

ROWS = fixture_rows()[:4]
CAP = MAX_INFERRED_CLASSES
OPTIONS = dict(workers=1, progress=False)


@pytest.fixture
def data(tmp_path) -> Path:
    """A folder for a conversion's source (the output goes beside it, not inside)."""
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def labelled(labels: pa.Array, names: list[str] | None = CLASSES, rows=ROWS) -> pa.Table:
    return hub_table(rows, names=names).set_column(1, "label", labels)


def in_place(path: Path, split: str = "train") -> list[int]:
    ds = open_dataset(str(path), split)
    return [ds.record(i).label for i in range(len(ds))]


def test_a_label_id_at_the_cap_is_a_bad_record_and_never_a_class(tmp_path):
    pq.write_table(labelled(pa.array([0, CAP, 2, CAP + 1], pa.int64()), names=None), tmp_path / TRAIN)
    ds = open_dataset(str(tmp_path / TRAIN))
    assert ds.classes == ["0", "1", "2"] and ds.record(2).label == 2  # the class list never reaches the id
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / TRAIN))}#row 1: label {CAP} is not a class id "
                                         rf"\(0\.\.2\); ids from {CAP:,} on are never classes"):
        ds.record(1)
    task_list = list_tasks(tmp_path)
    assert task_list.classes == ["0", "1", "2"] and len(task_list.tasks) == 2


def test_a_list_id_at_the_cap_is_a_bad_record_and_never_a_class(tmp_path):
    ids = pa.array([[0, 1], [5, CAP], [2], []], pa.list_(pa.int64()))
    table = hub_table(ROWS, names=None).drop_columns(["label"]).append_column("labels", ids)
    pq.write_table(table, tmp_path / TRAIN)
    ds = open_dataset(str(tmp_path / TRAIN))
    assert ds.classes == [str(n) for n in range(6)] and ds.record(0).fields.labels == (0, 1)
    with pytest.raises(ValueError, match=rf"#row 1: in its multi-label column 'labels', label {CAP} is not a class"):
        ds.record(1)


@pytest.mark.parametrize("kind, values, says", [
    (pa.int64(), [1, 2, 3, 4], "int64"),
    (pa.struct([("path", pa.string())]), [{"path": "a.jpg"}] * 4, r"struct<path: string>"),
    (pa.struct([("bytes", pa.int64()), ("path", pa.string())]), [{"bytes": 1, "path": "a"}] * 4,
     r"struct<bytes: int64, path: string>"),
])
def test_an_image_column_of_the_wrong_type_is_one_line_naming_the_file_and_the_type(tmp_path, kind, values, says):
    pq.write_table(hub_table(ROWS).set_column(0, "image", pa.array(values, kind)), tmp_path / TRAIN)
    message = rf"^{re.escape(str(tmp_path / TRAIN))}: the image column 'image' holds {says}, not image bytes: " \
        r"expected binary, or the Hub's Image struct \{bytes: binary, path: string\}"
    for read in (lambda: open_dataset(str(tmp_path / TRAIN)), lambda: list_tasks(tmp_path)):
        with pytest.raises(ValueError, match=message) as err:
            read()
        assert "\n" not in str(err.value)


def test_a_binary_image_column_is_read_as_the_images(tmp_path):
    table = hub_table(ROWS)
    pq.write_table(table.set_column(0, "image", pa.array([b for _, b, _ in ROWS], pa.large_binary())), tmp_path / TRAIN)
    ds = open_dataset(str(tmp_path / TRAIN))
    assert [ds.record(i).data for i in range(len(ds))] == [b for _, b, _ in ROWS]


@pytest.mark.parametrize("kind", [pa.uint8(), pa.uint16(), pa.uint64(), pa.int8()])
def test_an_unsigned_or_narrow_label_column_gives_the_labels_in_place_and_converted(tmp_path, kind):
    rows = fixture_rows()[:12:3]
    pq.write_table(labelled(pa.array([2, None, 0, 1], kind), rows=rows), tmp_path / TRAIN, row_group_size=2)
    assert in_place(tmp_path / TRAIN) == [2, -1, 0, 1]
    assert [t.label for t in list_tasks(tmp_path).tasks] == [2, -1, 0, 1]


def test_a_uint64_label_past_int64_is_a_bad_record_not_unlabeled(tmp_path):
    pq.write_table(labelled(pa.array([2, 2**64 - 1, 0, None], pa.uint64())), tmp_path / TRAIN)
    ds = open_dataset(str(tmp_path / TRAIN))
    assert [ds.record(i).label for i in (0, 2, 3)] == [2, 0, -1]
    with pytest.raises(ValueError, match=r"#row 1: label 9223372036854775807 is not a class id"):
        ds.record(1)


@pytest.mark.parametrize("kind, values", [(pa.float64(), [0.0, 1.5, 2.0, 1.0]), (pa.string(), ["a", "b", "c", "d"])])
def test_a_float_or_string_label_column_is_one_line(tmp_path, kind, values):
    pq.write_table(labelled(pa.array(values, kind)), tmp_path / TRAIN)
    with pytest.raises(ValueError, match=rf"{TRAIN}: the label column 'label' holds {kind}, not integers"):
        open_dataset(str(tmp_path / TRAIN))


def hub_val(root: Path, names: list[str]) -> list[int]:
    """A train file with CLASSES and a val file whose ClassLabel names are `names`, each val row's
    label the id of its class in `names`; the labels train's order gives them."""
    classes = [CLASSES.index(c) for c in ("fish", "dog", "cat", "fish")]
    pq.write_table(hub_table(ROWS), root / TRAIN)
    val = [(p, b, names.index(CLASSES[c]) if CLASSES[c] in names else 0) for (p, b, _), c in zip(ROWS, classes)]
    pq.write_table(hub_table(val, names=names), root / VAL)
    return classes


def test_validation_names_in_another_order_are_mapped_onto_train_s_by_name(tmp_path, data):
    want = hub_val(data, ["fish", "cat", "dog"])
    assert open_dataset(str(data / "*.parquet"), "val").classes == CLASSES
    assert in_place(data / "*.parquet", "val") == want
    convert(data, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert read_manifest(tmp_path / "out.lmdb").classes == CLASSES
    ds = open_dataset(tmp_path / "out.lmdb", "val")
    stored = {ds.record(i).data: ds.record(i).label for i in range(len(ds))}
    assert [stored[b] for _, b, _ in ROWS] == want


def test_validation_names_of_another_set_are_one_line_naming_the_first_difference(tmp_path):
    hub_val(tmp_path, ["fish", "cat", "bird" * 10_000])
    message = rf"^{re.escape(str(tmp_path / VAL))}: its class names are not those of " \
        rf"{re.escape(str(tmp_path / TRAIN))} \(3 names against 3; the first difference: 'birdbird.*\.\.\. is " \
        r"not in the other\); every split's"
    for read in (lambda: open_dataset(str(tmp_path / "*.parquet"), "val"), lambda: list_tasks(tmp_path)):
        with pytest.raises(ValueError, match=message) as err:
            read()
        assert len(str(err.value)) < 1000


def with_captions(path: Path) -> None:
    captions = pa.array([b"one", b"\xff\xfe two", None, b"four"], pa.binary()).view(pa.string())
    pq.write_table(hub_table(ROWS).append_column("caption", captions), path, row_group_size=4)


def test_a_caption_that_is_not_utf8_is_its_row_s_bad_record_in_place(tmp_path):
    with_captions(tmp_path / TRAIN)
    ds = open_dataset(str(tmp_path / TRAIN))
    assert [ds.record(i).fields.text for i in (0, 2, 3)] == ["one", None, "four"]  # the same row group, served
    bad = re.escape(f"{tmp_path / TRAIN}#row 1")
    with pytest.raises(ValueError, match=rf"^{bad}: its caption \(column 'caption'\) is not UTF-8: invalid start byte "
                                         r"at byte 0"):
        ds.record(1)


def test_a_caption_that_is_not_utf8_skips_its_row_converted(tmp_path, data):
    with_captions(data / TRAIN)
    report = convert(data, tmp_path / "out.wds", ConvertOptions(**OPTIONS))
    assert [s["path"] for s in report.splits["train"].skipped] == [f"{TRAIN}#row 1"]
    assert report.splits["train"].skipped[0]["reason"].startswith("its caption (column 'caption') is not UTF-8")
    ds = open_dataset(tmp_path / "out.wds")
    assert sorted(ds.record(i).fields.text or "" for i in range(len(ds))) == ["", "four", "one"]


def test_a_file_name_that_is_not_utf8_is_read_and_converted(tmp_path, data):
    name = os.fsdecode(b"train-\xff\xfe.parquet")
    with open(data / name, "wb") as fh:  # pyarrow refuses such a path: it is given the open file
        pq.write_table(hub_table(ROWS), fh)
    ds = open_dataset(str(data / "*.parquet"))
    assert in_place(data / "*.parquet") == [label for *_, label in ROWS]
    assert ds.record(0).path == f"{data}/train-\\xff\\xfe.parquet#row 0"
    report = convert(data, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert report.processed == len(ROWS) and open_dataset(tmp_path / "out.lmdb").record(0).data == ROWS[0][1]


def opened_in_time(pattern: str, fifo: Path) -> BaseException | None:
    """open_dataset(pattern) in a thread: its error, after unblocking the FIFO (a writer opens it)
    when the open still waits after 10 s (a hang: the test fails)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            open_dataset(pattern)
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked reader go
        thread.join(10)
        pytest.fail(f"open_dataset({pattern}) blocked on the FIFO")
    return out[0]


@pytest.mark.parametrize("kind", ["a FIFO", "a folder", "a device"])
def test_a_fifo_folder_or_device_matched_by_the_pattern_is_one_line_naming_it(tmp_path, kind):
    pq.write_table(hub_table(ROWS), tmp_path / "train-00000-of-00002.parquet")
    odd = tmp_path / "train-00001-of-00002.parquet"
    {"a FIFO": os.mkfifo, "a folder": os.mkdir, "a device": lambda p: p.symlink_to("/dev/zero")}[kind](odd)
    error = opened_in_time(str(tmp_path / "*.parquet"), odd)
    said = {"a device": "a character device"}.get(kind, kind)  # durable.file_kind's words
    assert isinstance(error, ValueError) and re.match(rf"{re.escape(str(odd))} is {said}, not a regular file",
                                                      str(error)), error


def test_classlabel_names_given_twice_are_one_line_naming_the_file_in_place_and_converted(tmp_path, data):
    pq.write_table(hub_table(ROWS, names=["dog", "cat", "dog"]), data / TRAIN)
    said = rf"{re.escape(str(data / TRAIN))}: its ClassLabel names are not unique \(1 name given twice: 'dog'\)"
    with pytest.raises(ValueError, match=said):
        open_dataset(str(data / "*.parquet"))
    with pytest.raises(ValueError, match=said):
        convert(data, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
