"""`DIR/last.pt`: model (and its EMA), optimizer, scaler, schedule, loader position, partial-epoch
sums, and the run's config with its augmentation recipe.

Written by rank 0 only, at optimizer-step boundaries (never half-accumulated gradients), through
datapipe.train.durable: temp file, fsync, rename, so the previous last.pt stays whole until the new
one is, and a full disk is one line. The file is torch's zip followed by a 48-byte footer (magic,
the sha256 of the zip, its length): torch.load, mmap included, ignores bytes past the zip, and a
resume checks the digest first, so a truncated, empty or bit-flipped file is one line, never a
traceback or a silent resume. Files from before the footer load with an info line. Read with
weights_only=True: a checkpoint holds tensors and plain values, never code.
"""
from __future__ import annotations

import hashlib
import logging
import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..augment.recipe import PRESETS, Recipe
from ..errors import ExpectedError, first_line
from ..storage import durable
from .config import RUN_SETTINGS, TrainConfig, as_recipe

log = logging.getLogger("datapipe.train")
FOOTER = struct.Struct("<8s32sQ")  # magic, sha256 of the zip before it, the zip's length
MAGIC = b"DPSHA256"
ZIP_END = b"PK\x05\x06"  # a zip's end-of-central-directory record: the last 22 bytes of torch's files
_verified: dict[str, tuple[int, ...]] = {}  # path -> the stat it was verified at (the CLI, then the trainer)


class CheckpointUnreadable(ExpectedError):
    """A checkpoint that is empty, truncated, altered or not a checkpoint at all."""


class _Digesting:
    """The file torch.save writes to (it only appends): counts and hashes every byte."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += memoryview(data).nbytes
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def save(path: Path, state: dict[str, Any]) -> None:
    """`state` as `path`, with its digest; the previous file at `path` stays until this one is whole."""
    advice = (f"the previous checkpoint {path} is intact: free space there (or give --out a larger disk), then "
              f"resume with --resume {path}" if path.exists() else
              "no checkpoint was saved yet: free space there (or give --out a larger disk) and start again")
    with durable.atomic_write(path, needs=_tensor_bytes(state), advice=advice) as fh:
        zipped = _Digesting(fh)
        torch.save(state, zipped)
        fh.write(FOOTER.pack(MAGIC, zipped.sha.digest(), zipped.size))


def _tensor_bytes(state: Any) -> int:
    """The bytes of the tensors in `state` (shared storages once): most of its checkpoint's size."""
    seen: dict[int, int] = {}
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(seen.values())


def load(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint's state, its digest checked first; mmap=True reads tensors only where they are used."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; --resume takes the last.pt that a run wrote into its --out")
    verify(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # a file from before the digest, damaged: torch's words, on one line
        raise _unreadable(path, f"torch cannot read it ({first_line(exc)})") from None


def verify(path: Path) -> None:
    """Check the footer's sha256 against the file (once per process and version of the file)."""
    st = path.stat()
    key, stamp = str(path.resolve()), (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    if _verified.get(key) == stamp:
        return
    if st.st_size == 0:
        raise _unreadable(path, "it is empty (0 bytes): the run was stopped or the disk was full while it was written")
    with open(path, "rb") as fh:
        fh.seek(max(0, st.st_size - FOOTER.size))
        tail = fh.read()
        if len(tail) == FOOTER.size and tail.startswith(MAGIC):
            _, expected, size = FOOTER.unpack(tail)
            if size + FOOTER.size != st.st_size or _sha256(fh, size) != expected:
                raise _unreadable(path, "its content does not match the sha256 it was saved with (a changed byte: "
                                        "a disk or copy error)")
        elif tail[-22:-18] == ZIP_END:  # a whole zip without our footer: written before checkpoints had one
            log.info("%s has no sha256 footer (written by an older datapipe): loaded without an integrity check", path)
        else:
            raise _unreadable(path, f"it is truncated or not a checkpoint ({st.st_size:,} bytes, no end record)")
    _verified[key] = stamp


def _sha256(fh: BinaryIO, size: int) -> bytes:
    """The sha256 of the first `size` bytes of `fh`."""
    sha, left = hashlib.sha256(), size
    fh.seek(0)
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            break
        sha.update(chunk)
        left -= len(chunk)
    return sha.digest()


def _unreadable(path: Path, why: str) -> CheckpointUnreadable:
    return CheckpointUnreadable(f"cannot resume from {path}: {why}; resume from an earlier copy of the "
                                "checkpoint, or start again with a new --out")


def run_settings(path: str | Path) -> dict[str, Any]:
    """The RUN_SETTINGS a checkpoint's run had (its tensors are memory-mapped, not read); the recipe
    as a Recipe."""
    state = load(path, mmap=True)
    saved = state.get("config", {})
    found = {name: saved[name] for name in RUN_SETTINGS if name in saved}
    found["recipe"] = saved_recipe(state)
    return found


def saved_recipe(state: dict[str, Any]) -> Recipe:
    """The recipe a checkpoint's run trained with: its config's, else its loader's, else (checkpoints
    older than recipes) the loader's historical view, the default."""
    for part in (state.get("config", {}), state.get("loader", {})):
        if part.get("recipe") is not None:
            return as_recipe(part["recipe"])
    return PRESETS["default"]


def refuse_another_course(state: dict[str, Any], config: TrainConfig) -> None:
    """A resume continues the run it was saved from: another recipe or optimizer is refused (one
    line, before anything is loaded)."""
    recipe = saved_recipe(state)
    if recipe != config.recipe:
        raise ValueError(f"cannot resume from {config.resume}: it was trained with recipe {recipe.name!r}, this run "
                         f"asks for {config.recipe.name!r} ({recipe.describe_difference(config.recipe)}); resume with "
                         "the recipe it was saved with (leave out --recipe and the recipe flags) or start a new --out")
    opt = state.get("config", {}).get("opt", "sgd")
    if opt != config.opt:
        raise ValueError(f"cannot resume from {config.resume}: it was trained with --opt {opt}, this run asks for "
                         f"--opt {config.opt} (their optimizer states differ); resume with --opt {opt} or start a new --out")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, in order: equal on ranks that hold the same weights."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
