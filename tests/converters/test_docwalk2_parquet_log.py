"""The Parquet scan's log line counts its files in words: `datapipe convert data/ out.wds` logged
"3 Parquet file(s)" (and "1 Parquet file(s)" for one file)."""
import logging

import pytest

pytest.importorskip("pyarrow", reason="the parquet extra is part of the dev install")
from converters.parquet import scan_parquet  # noqa: E402
from tests.parquet_data import write_hub  # noqa: E402


@pytest.mark.parametrize("pick, said", [(None, "3 Parquet files"), ("train", "1 Parquet file ")])
def test_the_file_count_is_a_plural_only_above_one(tmp_path, caplog, pick, said):
    root = write_hub(tmp_path / "data")
    with caplog.at_level(logging.INFO):
        scan_parquet(str(root), split=pick)
    assert said in caplog.text and "file(s)" not in caplog.text
