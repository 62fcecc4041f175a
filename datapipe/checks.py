"""The numeric checks of options, in one place: Recipe, LoaderOptions, SizeRamp and TrainConfig call
these from their __post_init__. A value is of the right type first (a bool is not a number here, a
str is not an int), then finite, then within its range; each refusal is one ValueError line naming
the field, the value (its repr, capped) and the range. Kept free of heavy imports."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

SHOWN = 60  # characters of a refused value's repr in a message
# A seed: a non-negative int of 63 bits (numpy's SeedSequence refuses negatives; torch.manual_seed
# takes 64 bits at most; datapipe.order.permutation mixes it into 64-bit keys).
MAX_SEED = 2**63 - 1


_CONTAINERS = (Mapping, list, tuple, set, frozenset)


def shown(value: Any, limit: int = SHOWN) -> str:
    """A value in a message, at a bounded cost: repr(value) cut to `limit` characters (a 1 MB string is
    not a message); a container past 8 items or nested by its kind and length (its repr may be gigabytes,
    or nested past the recursion limit); an int past 60 digits by its length (repr refuses past 4,300)."""
    if isinstance(value, _CONTAINERS):
        items = [*value, *value.values()] if isinstance(value, Mapping) and len(value) <= 8 else value
        if len(value) > 8 or any(isinstance(v, _CONTAINERS) for v in items):
            return f"a {type(value).__name__} of {len(value):,} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 199:
        return f"an int of about {int(value.bit_length() * 0.30103):,} digits"
    try:
        text = repr(value)
    except Exception:  # a user's object whose repr raises still gets its message
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _bound(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def span(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> str:
    """An interval as words: 'within [0, 1]', 'within (0, 1]', '>= 0', '> 0'."""
    if high == math.inf:
        return f"{'>' if low_open else '>='} {_bound(low)}"
    return f"within {'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"


def is_real(value: Any) -> bool:
    """A real number, not a bool (True is not 1 here), a str or a tensor."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def inside(x: float, low: float, high: float, low_open: bool = False, high_open: bool = False) -> bool:
    """Finite and within the interval (NaN never is)."""
    return (math.isfinite(x) and (low < x if low_open else low <= x) and (x < high if high_open else x <= high))


def real(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *, what: str = "a finite number",
         low_open: bool = False, high_open: bool = False, note: str = "") -> float:
    """`value` as a float: a real number, finite, within the interval; else a ValueError naming it."""
    try:
        x = float(value) if is_real(value) else math.nan
    except OverflowError:  # an int past a float's range (10**400)
        x = math.inf
    if not inside(x, low, high, low_open, high_open):
        raise ValueError(f"{name} must be {what} {span(low, high, low_open=low_open, high_open=high_open)}{note}, "
                         f"got {shown(value)}")
    return float(value)


def probability(name: str, value: Any) -> float:
    return real(name, value, 0, 1, what="a probability, a number")


def integer(name: str, value: Any, low: int, high: int | None = None, *, note: str = "") -> int:
    """`value` as an int within low..high (no upper bound when None); a bool or a float is refused."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if low <= int(value) and (high is None or int(value) <= high):
            return int(value)
    where = f">= {low}" if high is None else f"within {low}..{high}"
    raise ValueError(f"{name} must be {where} (an int{note}), got {shown(value)}")


def reals(name: str, value: Any, count: int, low: float, high: float, *, note: str = "") -> tuple[float, ...]:
    """`count` real numbers, each finite and within [low, high]; else one line naming the field."""
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != count or not all(is_real(v) and inside(float(v), low, high) for v in items):
        raise ValueError(f"{name} must be {count} finite numbers, each {span(low, high)}{note}, got {shown(value)}")
    return tuple(float(v) for v in items)


def bounded_pair(name: str, value: Any, low: float, high: float, *, low_open: bool = False,
                 note: str = "") -> tuple[float, float]:
    """(a, b), finite, with low <= a <= b <= high (low < a where low_open); else one line naming it."""
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    ok = len(items) == 2 and all(is_real(v) and inside(float(v), low, high, low_open) for v in items)
    if not ok or float(items[0]) > float(items[1]):
        first = f"{_bound(low)} {'<' if low_open else '<='} low"
        raise ValueError(f"{name} must be a pair (low, high) of finite numbers with {first} <= high <= "
                         f"{_bound(high)}{note}, got {shown(value)}")
    return float(items[0]), float(items[1])
