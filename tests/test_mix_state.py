"""A mix loader's state with a malformed `mix` block (a hand-edited checkpoint, a stranger's file): every
one refused in one line at load, naming the key and what is wrong, before any of it reaches the
arithmetic (was: an AttributeError, an OverflowError at the first batch, or accepted without a word);
a key deleted no longer skips the check it fed."""
from __future__ import annotations

import copy

import pytest

from datapipe.mix.order import MixOrder, MixState
from datapipe.order.sharding import Shard
from tests.test_mix_order import A, B, make_mix, order


def mid_epoch() -> dict:
    o = order(make_mix(A), world=2)
    return {"epoch": 1, **o.save(o.offset_after(0, 2), 1)}


def edited(path: tuple, value=None, *, delete: bool = False) -> dict:
    state = copy.deepcopy(mid_epoch())
    *where, last = path
    target = state
    for key in where:
        target = target[key]
    if delete:
        del target[last]
    else:
        target[last] = value
    return state


BAD = {
    "mix-a-list": (("mix",), [1, 2], r"'mix' must be a dict .*got list"),
    "draws-1e30": (("mix", "draws_before", "big"), 10**30, r"mix\['draws_before'\]\['big'\] must be within 0\.\."),
    "draws-negative": (("mix", "draws_before", "web"), -3, r"mix\['draws_before'\]\['web'\] must be within 0\.\."),
    "draws-a-float": (("mix", "draws_before", "web"), 3.5, r"mix\['draws_before'\]\['web'\] must be .*got 3\.5"),
    "draws-a-list": (("mix", "draws_before"), [0, 0, 0], r"mix\['draws_before'\] must be a dict, got list"),
    "draws-a-source-short": (("mix", "draws_before"), {"big": 0, "web": 0},
                             r"mix\['draws_before'\] must have one entry per source .*'small'"),
    "epoch-negative": (("epoch",), -5, r"'epoch' must be within 0\.\.2147483647 \(an int"),
    "epoch-a-str": (("epoch",), "1", r"'epoch' must be .*got '1'"),
    "epoch-huge": (("epoch",), 10**30, r"'epoch' must be within"),
    "samples-negative": (("samples_done",), -4, r"'samples_done' must be within 0\.\.60"),
    "samples-past-the-epoch": (("samples_done",), 10**30, r"'samples_done' must be within 0\.\.60"),
    "counts-short": (("mix", "counts"), [30, 30], r"mix\['counts'\] has 2 entries for the 3 sources"),
    "counts-negative": (("mix", "counts"), [70, -10, 0], r"mix\['counts'\] must be counts >= 0 that sum to .* 60"),
    "counts-sum": (("mix", "counts"), [1, 1, 1], r"mix\['counts'\] must be counts >= 0 that sum to"),
    "counts-a-dict": (("mix", "counts"), {"big": 30}, r"mix\['counts'\] must be a list, got dict"),
    "names-twice": (("mix", "names"), ["big", "big", "small"], r"mix\['names'\] must name each source once"),
    "names-ints": (("mix", "names"), [1, 2, 3], r"mix\['names'\] must hold strs, got 1"),
    "sources-a-str": (("mix", "sources"), "big-53", r"mix\['sources'\] must be a list, got str"),
    "epoch-size-zero": (("mix", "epoch_size"), 0, r"mix\['epoch_size'\] must be within 1\.\."),
    "epoch-size-true": (("mix", "epoch_size"), True, r"mix\['epoch_size'\] must be .*got True"),
    "streams-odd": (("mix", "streams"), ["records", "shards/0", "records"], r"mix\['streams'\] holds 'shards/0'"),
    "classes-none": (("mix", "classes"), None, r"mix\['classes'\] must be a list, got NoneType"),
    "order-a-number": (("mix", "order"), 1, r"mix\['order'\] must be a str, got 1"),
}
MISSING = ["names", "sources", "epoch_size", "counts", "order", "streams", "classes", "draws_before"]


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_mix_block_is_refused_in_one_line_naming_the_key(case):
    path, value, message = BAD[case]
    with pytest.raises(ValueError, match=r"^cannot resume: the state's " + message) as err:
        order(make_mix(A), world=3).restore(edited(path, value))
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


@pytest.mark.parametrize("key", MISSING)
def test_a_deleted_key_is_refused_not_skipped(key):
    """Deleting `counts` (or `sources`, ...) skipped the mid-epoch comparison it fed: a state under
    other weights then resumed into other samples."""
    with pytest.raises(ValueError, match=rf"^cannot resume: the state's mix\['{key}'\] is missing"):
        order(make_mix(B), world=3).restore(edited(("mix", key), delete=True))


@pytest.mark.parametrize("key", ["epoch", "samples_done", "mix"])
def test_a_deleted_top_level_key_is_one_line(key):
    with pytest.raises(ValueError, match="cannot resume: "):
        order(make_mix(A)).restore(edited((key,), delete=True))


def test_a_state_that_is_not_a_dict_is_one_line():
    with pytest.raises(ValueError, match="^cannot resume: a loader state is the dict its state_dict"):
        order(make_mix(A)).restore([("epoch", 1)])


def test_draws_that_would_leave_64_bits_with_this_epoch_size_are_refused():
    state = edited(("mix", "draws_before", "big"), 2**62)
    with pytest.raises(ValueError, match=r"would take the draws past 2\^62"):
        order(make_mix(A), world=3).restore(state)


def test_a_valid_state_still_resumes_and_one_at_a_boundary_needs_no_counts():
    assert order(make_mix(A), world=3).restore(mid_epoch()) == mid_epoch()["samples_done"]
    boundary = {"epoch": 2, **order(make_mix(A)).save(0, 2)}
    assert "counts" not in boundary["mix"]
    fresh = MixOrder(60, 4, Shard(0, 2), 3, state=MixState(make_mix(B)))
    assert fresh.restore(boundary) == 0 and fresh.state.since[0] == 2
