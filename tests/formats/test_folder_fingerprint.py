"""A plain image folder's loader state carries its listing's fingerprint, as a packed dataset's carries
its records' (issue #47, row 3): a file renamed or moved to another class between a mid-epoch
`state_dict()` and the resume changed the rest of the epoch, unrefused; now the resume is refused in
one line, alone or inside a Mix, an unchanged folder resumes exactly, and a state saved before
(no fingerprint) still loads, with a warning."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from datapipe import Mix, make_loader, open_dataset

SMALL = dict(backend="threads", batch_size=4, image_size=16, device="cpu", seed=3)


@pytest.fixture
def folder(clean_folder, tmp_path) -> Path:
    return Path(shutil.copytree(clean_folder, tmp_path / "images"))


def loader_of(source, tmp_path: Path):
    return make_loader(source, **SMALL) if isinstance(source, Mix) else make_loader(source, cache_dir=tmp_path / "c",
                                                                                     **SMALL)


def saved_after(loader, batches: int) -> tuple[dict, list[list[int]]]:
    """The state after `batches` batches of the first epoch, and the rest of that epoch's indices."""
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    return state, [b.indices.tolist() for b in it]


CHANGES = {"renamed": ("train/cat/cat_000.jpg", "train/cat/zz_cat.jpg"),  # same count, another place in the order
           "moved to another class": ("train/cat/cat_001.jpg", "train/dog/cat_001.jpg")}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_mid_epoch_resume_over_a_changed_folder_is_refused_in_one_line(folder, tmp_path, change):
    state, _ = saved_after(loader_of(folder, tmp_path), 2)
    before, after = CHANGES[change]
    (folder / before).rename(folder / after)
    with pytest.raises(ValueError, match=rf"^cannot resume: the state was saved over other records than {folder} holds "
                                         r"now \(another dataset, this one re-converted, or an image folder's files "
                                         r"renamed, moved, added or removed since\); resume with the dataset it was "
                                         r"saved with$"):
        loader_of(folder, tmp_path).load_state_dict(state)


def test_an_unchanged_folder_resumes_exactly(folder, tmp_path):
    state, rest = saved_after(loader_of(folder, tmp_path), 2)
    assert state["dataset"] == open_dataset(folder).fingerprint and rest
    (folder / "train" / "cat" / "cat_000.jpg").write_bytes((folder / "train" / "cat" / "cat_002.jpg").read_bytes())
    again = loader_of(folder, tmp_path)  # a rescan: the same listing (a file's bytes are not part of it)
    again.load_state_dict(state)
    assert [b.indices.tolist() for b in again] == rest


def test_a_state_saved_before_folders_had_a_fingerprint_still_resumes_with_a_warning(folder, tmp_path, caplog):
    state, rest = saved_after(loader_of(folder, tmp_path), 3)
    state["dataset"] = None  # what the datapipe before saved for a folder
    again = loader_of(folder, tmp_path)
    with caplog.at_level(logging.WARNING, logger="datapipe.backends.base"):
        again.load_state_dict(state)
    warned = [r.getMessage() for r in caplog.records if "fingerprint" in r.getMessage()]
    assert warned == [f"resuming mid-epoch over {folder} from a state without its fingerprint: not checked against "
                      "changes since it was saved"]
    assert [b.indices.tolist() for b in again] == rest


def test_the_fingerprint_follows_the_listing_not_the_scan(folder, tmp_path):
    first = open_dataset(folder).fingerprint
    assert first.startswith("folder listing ") and open_dataset(folder, cache_dir=tmp_path / "c").fingerprint == first
    assert open_dataset(folder, "val").fingerprint != first
    (folder / "train" / "fish" / "fish_000.jpg").rename(folder / "train" / "fish" / "fish_100.jpg")
    assert open_dataset(folder).fingerprint != first


def test_a_folder_inside_a_mix_changed_mid_epoch_is_refused_in_one_line(folder, packed_lmdb, tmp_path):
    def mix() -> Mix:
        return Mix({"fo": str(folder), "lm": str(packed_lmdb)}, epoch_size=24, cache_dir=tmp_path / "c")
    state, rest = saved_after(loader_of(mix(), tmp_path), 2)
    again = loader_of(mix(), tmp_path)
    again.load_state_dict(state)
    assert [b.indices.tolist() for b in again] == rest  # unchanged: exactly the rest
    (folder / "train" / "cat" / "cat_000.jpg").rename(folder / "train" / "cat" / "zz_cat.jpg")
    with pytest.raises(ValueError, match=r"^cannot resume mid-epoch: the state was saved with other source records "
                                         r".*\['folder listing [0-9a-f]{32}'.* this mix has \['folder listing ") as caught:
        loader_of(mix(), tmp_path).load_state_dict(state)
    assert "\n" not in str(caught.value)


def test_a_mix_state_saved_before_folders_had_a_fingerprint_still_resumes_with_a_warning(folder, packed_lmdb,
                                                                                         tmp_path, caplog):
    """The datapipe before stood 'PATH|RECORDS' in for a folder's fingerprint in a mix's state."""
    def mix() -> Mix:
        return Mix({"fo": str(folder), "lm": str(packed_lmdb)}, epoch_size=24, cache_dir=tmp_path / "c")
    state, rest = saved_after(loader_of(mix(), tmp_path), 2)
    folder_records = len(open_dataset(folder))
    state["mix"]["sources"][0] = f"{folder}|{folder_records}"
    again = loader_of(mix(), tmp_path)
    with caplog.at_level(logging.WARNING):
        again.load_state_dict(state)
    assert any("from a state without its fingerprint" in r.getMessage() for r in caplog.records)
    assert [b.indices.tolist() for b in again] == rest
