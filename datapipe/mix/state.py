"""A mix loader's state and its answers: the `mix` block of a state_dict checked key by key when it is
loaded (a malformed or hand-edited block is refused in one line naming the key, before any of it
reaches the arithmetic, and no check is skipped because a key is missing), and the ranks' agreement
on each epoch's answers (a weights function that is not pure would have ranks serve other samples).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from ..augment.recipe import MAX_AUG_REPEATS
from ..checks import integer, shown

MAX_EPOCH = 2**31 - 1
MAX_DRAWS = 2**62  # a source's draws before an epoch: its draws' keys stay within int64 (mix.order.MixKeys)
STREAM = re.compile(r"records|shards/[1-9][0-9]{0,8}")
WEIGHTS_READ = "decimal"  # saved as mix['weights_read']: a float weight read as its shortest decimal (0.7 is 7/10)
FIX = "resume from the state_dict() the loader saved, unedited"
PURE = ("a weights function must give one answer an epoch wherever and whenever it is asked (no clock, no random, "
        "no file edited during the run)")


def _bad(key: str, problem: str) -> NoReturn:
    raise ValueError(f"cannot resume: the state's {key} {problem}; {FIX}")


def _list(block: Mapping, key: str, kind: type, length: int | None = None) -> list:
    if key not in block:
        _bad(f"mix[{key!r}]", "is missing")
    value = block[key]
    if not isinstance(value, (list, tuple)):
        _bad(f"mix[{key!r}]", f"must be a list, got {type(value).__name__}")
    wrong = next((v for v in value if not isinstance(v, kind) or isinstance(v, bool)), None)
    if wrong is not None:
        _bad(f"mix[{key!r}]", f"must hold {kind.__name__}s, got {shown(wrong)}")
    if length is not None and len(value) != length:
        _bad(f"mix[{key!r}]", f"has {len(value)} entries for the {length} sources of mix['names']")
    return list(value)


def _int(block: Mapping, key: str, low: int, high: int, where: str) -> int:
    if key not in block:
        _bad(f"{where}[{key!r}]" if where else repr(key), "is missing")
    name = f"cannot resume: the state's {where}[{key!r}]" if where else f"cannot resume: the state's {key!r}"
    return integer(name, block[key], low, high, note=f"; {FIX}")


def check_block(state: Any) -> dict[str, Any]:
    """The `mix` block of a loader state, every key of the right type and range (one line otherwise).
    Always: names, sources, epoch_size, classes, streams, draws_before; mid-epoch also counts and order;
    repeats where saved (1 in a state from before repeated augmentation over a mix)."""
    if not isinstance(state, Mapping):
        raise ValueError(f"cannot resume: a loader state is the dict its state_dict() returned, got "
                         f"{type(state).__name__}")
    block = state["mix"]
    if not isinstance(block, Mapping):
        _bad("'mix'", f"must be a dict (the mix block state_dict() saved), got {type(block).__name__}")
    _int(state, "epoch", 0, MAX_EPOCH, "")
    names = _list(block, "names", str)
    if not names or len(set(names)) != len(names):
        _bad("mix['names']", f"must name each source once, got {shown(names)}")
    _list(block, "sources", str, len(names))
    size = _int(block, "epoch_size", 1, MAX_DRAWS, "mix")
    _list(block, "classes", str)
    streams = _list(block, "streams", str, len(names))
    odd = next((s for s in streams if not STREAM.fullmatch(s)), None)
    if odd is not None:
        _bad("mix['streams']", f"holds {shown(odd)}, not 'records' or 'shards/N'")
    _draws(block, names)
    repeats = _int(block, "repeats", 1, MAX_AUG_REPEATS, "mix") if "repeats" in block else 1  # none before aug_repeats
    done = _int(state, "samples_done", 0, size, "")
    if done > 0 or "counts" in block:
        counts, draws = _list(block, "counts", int, len(names)), -(-size // repeats)
        if any(c < 0 for c in counts) or sum(counts) != draws:
            _bad("mix['counts']", f"must be counts >= 0 that sum to the epoch's draws {draws} (mix['epoch_size'] over "
                                  f"mix['repeats']), got {shown(counts)}")
    if done > 0 or "order" in block:
        if not isinstance(block.get("order"), str):
            _bad("mix['order']", "is missing" if "order" not in block else
                 f"must be a str, got {shown(block['order'])}")
    return {**block, "repeats": repeats}


def _draws(block: Mapping, names: list[str]) -> None:
    """draws_before: each source of mix['names'] (a source left out would restart its stream), none else."""
    draws = block.get("draws_before")
    if not isinstance(draws, Mapping):
        _bad("mix['draws_before']", "is missing" if draws is None else f"must be a dict, got {type(draws).__name__}")
    if set(draws) != set(names):
        other = sorted(set(map(str, draws)) ^ set(names))
        _bad("mix['draws_before']", f"must have one entry per source of mix['names'] ({shown(other[0])} differs)")
    for name in names:
        _int(draws, name, 0, MAX_DRAWS, "mix['draws_before']")


def agree(mix: Any, epoch: int, counts: tuple[int, ...], before: tuple[int, ...], rank: int, world: int) -> None:
    """Under torch.distributed, in the process whose loader speaks for this rank, every rank's answers
    for `epoch` (its counts and each source's draws before it) gathered as a digest and compared: a
    weights function that answers differently on another rank is refused in one line. Every rank
    reaches this at the epoch's first batch (its loaders are iterated together, as DDP does)."""
    dist = sys.modules.get("torch.distributed")  # not imported: no process group (and no torch import here)
    if dist is None or os.getpid() != mix.home or not (dist.is_available() and dist.is_initialized()):
        return
    if (dist.get_rank(), dist.get_world_size()) != (rank, world):
        return  # a loader that is not this process group's rank: it does not speak for it
    digest = hashlib.sha256(json.dumps([epoch, list(counts), list(before)]).encode()).hexdigest()[:16]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, digest)
    other = next((r for r, d in enumerate(out) if d != out[0]), None)
    if other is not None:
        raise ValueError(f"the Mix's weights function is not pure: ranks 0 and {other} have other answers for epoch "
                         f"{epoch} (rank {rank}'s counts: {shown(list(counts))}); {PURE}")
