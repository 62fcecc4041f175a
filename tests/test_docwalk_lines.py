"""What mixing.md's commands print about a mix stays text and stays a line: a dataset file whose name holds
a terminal escape (a hostile name among `datapipe info *.lmdb`'s files) is shown as text by info's table
and the loader's banner, and a mix of many sources is a bounded banner and train mix line (found by
tools/adversarial/cases/docwalk.py: ESC echoed, clearing the screen; 40 sources, a 1,138-character line)."""
from __future__ import annotations

import logging

from datapipe import Mix, make_loader
from datapipe.cli import main
from datapipe.train.loaders import MIX_SHOWN, mix_text

EVIL = "evil\x1b[2J\x1b]0;pwned\x07.lmdb"


def test_info_shows_a_file_names_escapes_as_text(packed_lmdb, packed_wds, tmp_path, capsys):
    (tmp_path / EVIL).symlink_to(packed_lmdb)
    assert main(["info", str(tmp_path / EVIL), str(packed_wds)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b[2J" in out


def test_the_loader_banner_shows_a_mix_paths_escapes_as_text_and_cut(packed_lmdb, packed_wds, tmp_path, caplog):
    (tmp_path / EVIL).symlink_to(packed_lmdb)
    sources = {"evil": str(tmp_path / EVIL), **{f"s{i}": str(packed_wds) for i in range(30)}}
    with caplog.at_level(logging.INFO, logger="datapipe"):
        make_loader(Mix(sources), backend="threads", batch_size=4, image_size=32, num_workers=1)
    banner = next(r.getMessage() for r in caplog.records if " backend (" in r.getMessage())
    assert "\x1b" not in banner and "\x07" not in banner and "evil\\x1b[2J" in banner
    assert len(banner) < 500, len(banner)  # 31 sources' paths were one line of ~2,000 characters


def test_the_train_mix_line_names_the_first_sources_then_how_many_more(packed_lmdb):
    mix = Mix({f"s{i}": str(packed_lmdb) for i in range(40)}, epoch_size=4000)
    text = mix_text(mix)
    assert text.startswith("s0 0.025 (100 an epoch); s1 0.025 (100 an epoch)") and len(text) < 400, text
    assert text.count(" an epoch)") == MIX_SHOWN and f"; and {40 - MIX_SHOWN} more (`datapipe info`" in text
    two = Mix({"a": str(packed_lmdb), "b": str(packed_lmdb)}, weights={"a": 7, "b": 3}, epoch_size=16000)
    assert mix_text(two) == "a 0.700 (11,200 an epoch); b 0.300 (4,800 an epoch)"
