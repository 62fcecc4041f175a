"""make_loader(fields=..., tokenizer=...): every backend serves the caption, metadata and multi-label
targets of the record it served (a bad record's substitute's included), tokenizes in its workers,
resumes, and leaves the default Batch(images, labels, indices) as it was."""
from __future__ import annotations

import io
import os
import pickle
import re
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import datapipe
from datapipe import Batch, LoaderOptions, make_loader, open_dataset
from datapipe.backends.fields import TokenizerFailed
from datapipe.formats.lmdb import LmdbWriter
from datapipe.records import Fields, Manifest, Record, SplitInfo, canonical_meta, multi_labels, record_digest
from tests.processes import deadline, run_in_session

N, BAD, CLASSES = 23, 7, ["a", "b", "c", "d"]
SMALL = dict(batch_size=5, image_size=16, num_workers=2, max_bad_fraction=0.5)
DEADLINE_S = 120  # a hang fails instead of stalling the suite (spawned workers start in seconds)
# (backend, start method): DataLoader workers forked and spawned, the thread backend's decode
# threads, the prefetcher, DALI's CPU pipeline (device_id=None) with forked source workers
LOADERS = {"threads": ("threads", None), "dataloader-fork": ("dataloader", "fork"),
           "dataloader-spawn": ("dataloader", "spawn"), "prefetch": ("prefetch", "fork"), "dali": ("dali", None)}


def caption(i: int) -> str:
    return "" if i % 5 == 0 else f"photo {i} of a café" + "!" * (i % 3)  # none for every fifth record


def meta(i: int) -> dict:
    return {"i": i, "url": f"https://example.com/{i}.jpg", "size": [16, 16 + i]}


def tags(i: int) -> tuple[int, ...]:
    return () if i % 6 == 0 else multi_labels({i % 4, (3 * i) % 4})


def jpeg(i: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16 + 8 * (i % 3), 16), (10 * i % 256, 90, 200 - 5 * i)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def with_fields(tmp_path_factory):
    """An LMDB of N tiny JPEGs with captions (none on every fifth), JSON metadata and multi-labels;
    record BAD's bytes are not an image (served around)."""
    folder = tmp_path_factory.mktemp("fields") / "fields.lmdb"
    writer, info = LmdbWriter(folder, size_hint=N * 1000, shard_bytes=0), SplitInfo()
    for i in range(N):
        fields = Fields(caption(i) or None, canonical_meta(meta(i)), tags(i))
        data = b"this is not an image" if i == BAD else jpeg(i)
        label = tags(i)[0] if tags(i) else -1  # records.py: a multi-label record's label is its first
        key = f"r{i:04d}"
        record = Record(key, data, label, f"img/{i}.jpg", record_digest(key, label, data, fields), fields)
        writer.write("train", i, record)
        info.add(record)
    writer.close(Manifest("lmdb", CLASSES, {"train": info}))
    return folder


def loader_for(path, name: str, **options):
    backend, start = LOADERS[name]
    return make_loader(path, backend=backend, **{"start_method": start, **SMALL, **options})


def one_epoch(loader) -> list:
    with deadline(DEADLINE_S):
        return list(loader)


def check_served(batches, loader) -> list[int]:
    """Every record but BAD once, BAD served around by a substitute (counted); the served indices."""
    served = [i for b in batches for i in b.indices.tolist()]
    assert len(served) == N and set(served) == set(range(N)) - {BAD}
    assert [b.index for b in loader.skipped] == [BAD] and served.count(loader.skipped[0].substitute) == 2
    return served


@pytest.mark.parametrize("name", ["threads", "dataloader-fork", "prefetch", "dali"])
def test_texts_are_the_captions_of_the_served_records(with_fields, name):
    loader = loader_for(with_fields, name, fields=("image", "text"))
    batches = one_epoch(loader)
    check_served(batches, loader)
    for images, texts, indices in batches:
        assert images.shape[1:] == (3, 16, 16) and isinstance(texts, list)
        assert texts == [caption(i) for i in indices.tolist()]  # a substitute carries its own caption
    assert type(batches[0])._fields == ("images", "texts", "indices")
    assert type(batches[0]) is datapipe.batch_type(("image", "text"))


def where_tokenized(text: str) -> list[int]:
    """A tokenizer that says where it ran: [process id, 1 in a datapipe decode thread, the caption's
    length, its crc32]; open_clip's shape (1 x L for one string)."""
    decode_thread = threading.current_thread().name.startswith("datapipe-decode")
    return torch.tensor([[os.getpid(), int(decode_thread), len(text), zlib.crc32(text.encode())]])


@pytest.mark.parametrize("name", ["threads", "dataloader-fork", "dataloader-spawn", "dali"])
def test_the_tokenizer_runs_in_the_workers_and_gives_token_ids(with_fields, name):
    loader = loader_for(with_fields, name, fields=("image", "label", "text"), tokenizer=where_tokenized)
    batches = one_epoch(loader)
    served = check_served(batches, loader)
    ids = torch.cat([b.texts for b in batches])
    assert all(b.texts.dtype == torch.int64 and b.texts.shape == (len(b.indices), 4) for b in batches)
    assert ids[:, 2:].tolist() == [[len(caption(i)), zlib.crc32(caption(i).encode())] for i in served]
    if name == "threads":  # the decode threads of this process
        assert set(ids[:, 0].tolist()) == {os.getpid()} and set(ids[:, 1].tolist()) == {1}
    else:  # worker processes: DataLoader's (forked or spawned) or DALI's source workers
        assert os.getpid() not in set(ids[:, 0].tolist()) and set(ids[:, 1].tolist()) == {0}
    ds = open_dataset(with_fields)
    assert [l for b in batches for l in b.labels.tolist()] == [ds[i].label for i in served]


def ragged(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_token_ids_of_different_lengths_are_a_list_of_tensors(with_fields):
    batches = one_epoch(loader_for(with_fields, "threads", fields=("image", "text"), tokenizer=ragged))
    for b in batches:
        assert isinstance(b.texts, list)
        assert [t.tolist() for t in b.texts] == [ragged(caption(i)) for i in b.indices.tolist()]
    from datapipe.backends.fields import stack_ids

    assert stack_ids([np.array([1, 2]), np.array([3, 4])]).tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("name", ["threads", "dataloader-fork", "dali"])
def test_metas_and_multilabels_are_exact(with_fields, name):
    loader = loader_for(with_fields, name, fields=("image", "meta", "multilabel", "label"))
    batches = one_epoch(loader)
    check_served(batches, loader)
    ds = open_dataset(with_fields)
    for images, metas, multilabels, labels, indices in batches:
        served = indices.tolist()
        assert metas == [meta(i) for i in served]
        assert multilabels.dtype == torch.float32 and multilabels.shape == (len(served), len(CLASSES))
        assert [torch.nonzero(row).flatten().tolist() for row in multilabels] == [list(tags(i)) for i in served]
        assert labels.tolist() == [ds[i].label for i in served]


def test_default_fields_give_the_batch_they_always_gave(with_fields):
    assert LoaderOptions().fields == ("image", "label") and datapipe.batch_type() is Batch
    loader = loader_for(with_fields, "threads", fields=["image", "label"])
    batch = next(iter(loader))
    assert type(batch) is Batch and loader.field_spec is None
    pair = next(iter(loader_for(with_fields, "threads", fields=("image", "text"), batch_format="pair")))
    assert type(pair) is tuple and len(pair) == 2 and isinstance(pair[1], list)  # the first two fields


def test_an_unknown_or_absent_field_is_refused_in_one_line(with_fields, clean_folder):
    cases = [
        (dict(fields=("image", "caption")), r"unknown field 'caption' in fields=\('image', 'caption'\): choose from"),
        (dict(fields=("text", "image")), "fields must start with 'image'"),
        (dict(fields="image"), "fields must be a tuple of names"),
        (dict(tokenizer=ragged), "tokenizer= must be a callable on one caption and needs 'text' in fields"),
        (dict(fields=("image",), batch_format="pair"), "batch_format='pair' yields the first two fields"),
        (dict(fields=("image", "text"), mixup_alpha=0.8), "make soft targets of 'label', which fields="),
        (dict(fields=("image", "label", "multilabel"), cutmix_alpha=1.0), "not the 'multilabel' targets"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            loader_for(with_fields, "threads", **options)
        assert "\n" not in str(err.value)
    for name in ("dataloader-spawn", "dali"):  # spawned workers: refused before any starts
        with pytest.raises(ValueError, match="tokenizer <function .*<lambda>.* cannot be pickled for"):
            loader_for(with_fields, name, fields=("image", "text"), tokenizer=lambda text: [1], start_method="spawn")
    with pytest.raises(ValueError, match=r"carries fields \('image', 'label'\), not 'text'"):
        make_loader(clean_folder, backend="threads", fields=("image", "text"), **SMALL)


def test_a_field_batch_pickles_here_and_in_a_new_process(with_fields, tmp_path):
    fields = ("image", "text", "meta", "multilabel")
    batch = next(iter(loader_for(with_fields, "threads", fields=fields, train=False)))
    again = pickle.loads(pickle.dumps(batch))
    assert type(again) is type(batch) and again.texts == batch.texts and again.metas == batch.metas
    assert torch.equal(again.images, batch.images) and torch.equal(again.multilabels, batch.multilabels)
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    code = ("import pickle, sys; b = pickle.load(open(sys.argv[1], 'rb')); "
            "print(type(b).__name__, list(b._fields), b.texts[0])")
    root = Path(__file__).resolve().parents[2]  # where `import datapipe` finds this tree
    out = run_in_session([sys.executable, "-c", code, str(tmp_path / "batch.pkl")], 60, cwd=root).stdout
    assert out.split()[:2] == ["Batch_image_text_meta_multilabel", "['images',"] and batch.texts[0] in out


@pytest.mark.parametrize("name", ["threads", "dataloader-fork", "dali"])
def test_resume_mid_epoch_serves_the_same_index_caption_pairs(with_fields, name):
    options = dict(fields=("image", "text"), train=True)
    whole = loader_for(with_fields, name, **options)
    whole.set_epoch(2)
    expected = [(i, t) for b in one_epoch(whole) for i, t in zip(b.indices.tolist(), b.texts)]
    first = loader_for(with_fields, name, **options)
    first.set_epoch(2)
    with deadline(DEADLINE_S):
        seen = [(i, t) for _, b in zip(range(2), first) for i, t in zip(b.indices.tolist(), b.texts)]
    resumed = loader_for(with_fields, name, **options)
    resumed.load_state_dict(first.state_dict())
    rest = [(i, t) for b in one_epoch(resumed) for i, t in zip(b.indices.tolist(), b.texts)]
    assert seen + rest == expected and all(t == caption(i) for i, t in expected)


def test_multi_hot_targets():
    from datapipe.backends.fields import multi_hot

    assert multi_hot([(0, 2), ()], 3).tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def refuses(text: str) -> list[int]:
    raise KeyError("no vocabulary entry")


def floats(text: str) -> list[float]:
    return [0.5] * 3


RAISES, FLOATS = (refuses, r"KeyError: 'no vocabulary entry'"), (floats, r"ValueError: tokenizer= must return one")


@pytest.mark.parametrize("name, tokenizer, reason", [("threads", *FLOATS), ("dataloader-fork", *RAISES),
                                                     ("dataloader-fork", *FLOATS)])
def test_a_failing_tokenizer_is_one_line_naming_it_and_the_caption(with_fields, name, tokenizer, reason):
    loader = loader_for(with_fields, name, fields=("image", "text"), tokenizer=tokenizer)
    with deadline(DEADLINE_S), pytest.raises(TokenizerFailed) as caught:
        one_epoch(loader)
    message = str(caught.value)
    assert "\n" not in message, message  # not a worker's wrapped traceback
    assert re.match(rf"tokenizer '{tokenizer.__name__}' failed on the caption '.*': {reason}", message), message
