"""`datapipe convert` from Parquet files in the Hugging Face Hub's layout (converters.parquet)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from converters import ConvertOptions, convert, list_tasks
from datapipe import open_dataset, read_manifest
from datapipe.cli.main import main
from datapipe.image.decode import check_image
from datapipe.formats.inspect import verify
from tests.conftest import BAD_FILES
from tests.converters.stopping import after_checkpoint, kill_convert_when_stopped
from tests.parquet_data import CLASSES, IMAGE, TEST, TRAIN, VAL, fixture_rows, hub_table, write_hub

OPTIONS = dict(workers=2, progress=False, shard_bytes=64 << 10, checkpoint_every=4)


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    return write_hub(tmp_path_factory.mktemp("hub") / "data")


def expected(hub: Path) -> dict[str, list[tuple[bytes, int]]]:
    """Each split's (image bytes, label) rows, bad images left out: the rows' own bytes, except where
    a folder's file would be stored converted too (the 16-bit PNG: datapipe.image.decode.check_image)."""
    out, checks = {}, ConvertOptions().checks
    for split, name in (("train", TRAIN), ("val", VAL), ("test", TEST)):
        table = pq.read_table(hub / name)
        out[split] = [(check_image(img["bytes"], **checks).data, label)
                      for img, label in zip(table["image"].to_pylist(), table["label"].to_pylist())
                      if img["path"] not in {Path(b).name for b in BAD_FILES}]
        assert sum(data in table["image"].combine_chunks().field("bytes").to_pylist() for data, _ in out[split]) >= \
            len(out[split]) - 1  # byte-exact
    return out


def contents(dst: Path) -> dict[str, list[tuple[bytes, int]]]:
    manifest = read_manifest(dst)
    out = {}
    for split in manifest.splits:
        ds = open_dataset(dst, split)
        out[split] = sorted((s.data, s.label) for s in (ds[i] for i in range(len(ds))))
    return out


def one_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("datapipe convert: error:")]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("suffix", [".lmdb", ".wds"])
def test_rows_round_trip_byte_exact_with_their_labels_and_the_hub_class_names(hub, tmp_path, suffix):
    dst = tmp_path / f"out{suffix}"
    report = convert(hub, dst, ConvertOptions(**OPTIONS))
    assert contents(dst) == {split: sorted(rows) for split, rows in expected(hub).items()}
    manifest = read_manifest(dst)
    assert manifest.classes == CLASSES
    assert sorted(manifest.splits) == ["test", "train", "val"]  # validation-* is our val; test has labels -1
    bad = {f"{TRAIN}#row {n}" for n, (path, *_) in enumerate(fixture_rows()) if path in BAD_FILES}
    assert {s["path"] for s in manifest.splits["train"].skipped} == bad and len(bad) == len(BAD_FILES)
    assert report.skipped == len(bad)
    assert verify(dst, progress=False).ok


def test_without_metadata_the_classes_are_the_labels_and_wds_order_keeps_row_groups_together(tmp_path):
    rows = fixture_rows()
    pq.write_table(hub_table(rows, names=None), tmp_path / "train-00000-of-00002.parquet", row_group_size=5)
    pq.write_table(hub_table(rows[:6], names=None), tmp_path / "train-00001-of-00002.parquet", row_group_size=5)
    task_list = list_tasks(tmp_path, shuffle_seed=3)
    assert task_list.classes == ["0", "1", "2"] and task_list.splits == ["train"] and len(task_list.tasks) == len(rows) + 6
    groups = [(t.path.archive, t.path.group) for t in task_list.tasks]
    runs = [g for n, g in enumerate(groups) if n == 0 or g != groups[n - 1]]
    assert len(runs) == len(set(groups)) == 6 + 2  # shuffled by row group: a worker reads each once
    assert all(type(t.path).__name__ == "ParquetRow" and t.relpath.endswith(f"#row {t.path.row}") for t in task_list.tasks)
    assert list_tasks(tmp_path, shuffle_seed=3).tasks == task_list.tasks != list_tasks(tmp_path).tasks


def test_a_row_without_image_bytes_or_with_an_unknown_label_is_skipped_and_the_rest_packed(hub, tmp_path):
    rows = fixture_rows()[:4]
    table = hub_table(rows).set_column(1, "label", pa.array([0, 7, 1, 2], pa.int64()))
    table = table.set_column(0, "image", pa.array([{"bytes": None, "path": "a.jpg"}] + table["image"].to_pylist()[1:],
                                                  IMAGE))
    pq.write_table(table, tmp_path / TRAIN, row_group_size=2)
    report = convert(tmp_path / TRAIN, tmp_path / "out.lmdb", ConvertOptions(**OPTIONS))
    assert {s["path"]: s["reason"] for s in report.splits["train"].skipped} == {
        f"{TRAIN}#row 0": "no image bytes in column 'image' (null, or a path only)",
        f"{TRAIN}#row 1": "label 7 is not a class id (0..2)"}
    assert contents(tmp_path / "out.lmdb") == {"train": sorted([(rows[2][1], 1), (rows[3][1], 2)])}
    task_list = list_tasks(hub, split="val")
    assert task_list.splits == ["val"] and task_list.classes == CLASSES


def test_a_truncated_file_is_one_line_naming_it(hub, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(hub, root)
    blob = (root / VAL).read_bytes()
    (root / VAL).write_bytes(blob[: len(blob) // 2])  # a download cut short: no footer
    assert main(["convert", str(root), str(tmp_path / "out.lmdb")]) == 2
    assert re.search(rf"{VAL}: not readable as Parquet \(.*\); a truncated download\?", one_error(capsys))
    assert not (tmp_path / "out.lmdb").exists()


def test_a_missing_column_is_one_line_naming_it_and_the_columns_found(tmp_path, capsys):
    table = hub_table(fixture_rows()[:3], names=None).rename_columns(["picture", "label"])
    pq.write_table(table, tmp_path / TRAIN)
    assert main(["convert", str(tmp_path / TRAIN), str(tmp_path / "out.wds")]) == 2
    error = one_error(capsys)
    assert re.search(rf"{TRAIN}: no 'image' column \(Image; looked for image, img\); its columns are picture, label",
                     error), error


def test_the_cli_converts_one_parquet_file(hub, tmp_path):
    dst = tmp_path / "out.wds"
    done = subprocess.run([sys.executable, "-m", "datapipe", "convert", str(hub / VAL), str(dst), "--workers", "1",
                           "-q"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert contents(dst) == {"val": sorted(expected(hub)["val"])}


def test_a_killed_conversion_resumes_to_the_clean_result(hub, tmp_path):
    clean, dst = tmp_path / "clean.lmdb", tmp_path / "resumed.lmdb"
    convert(hub, clean, ConvertOptions(**OPTIONS))
    kill_convert_when_stopped(["convert", str(hub), str(dst), "--workers", "2", "--checkpoint-every", "4", "-q"],
                              after_checkpoint(8))
    assert not dst.exists()
    report = convert(hub, dst, ConvertOptions(**OPTIONS, resume=True))
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in hub.iterdir())
    assert 0 < report.processed < total
    assert read_manifest(dst).splits == read_manifest(clean).splits
    assert contents(dst) == contents(clean)
