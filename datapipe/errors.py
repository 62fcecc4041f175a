"""The base of failures a user can cause and fix (bad data, bad options): the CLI prints their
message as one line and exits non-zero, without a traceback. Kept free of heavy imports."""
import errno
import itertools
from typing import Collection


class ExpectedError(Exception):
    """An expected failure whose message says what went wrong and what to do."""


def first_line(exc: BaseException, limit: int = 160) -> str:
    """An exception as one short line. DALI's errors run to dozens of lines (the operator, the
    pipeline's traceback, then what it "encountered:"): that line is the one kept."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    after = [lines[k + 1] for k, line in enumerate(lines[:-1]) if line == "encountered:"]
    text = (after or lines or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


class OwnLineError(ExpectedError):
    """An expected error that keeps its own one line when a worker's traceback is wrapped around it:
    torch's DataLoader re-raises a worker's error as its type with "Caught X in DataLoader worker
    process 0. Original Traceback ..."; DALI reports its source worker's error with the pipeline's."""

    def __init__(self, message: str) -> None:
        marker = f"{type(self).__name__}: "
        found = [line for line in str(message).splitlines() if marker in line]
        super().__init__(found[-1].partition(marker)[2].strip() if found else message)


class DiskFull(ExpectedError):
    """No space left (ENOSPC) or over quota (EDQUOT) while writing a file: the message names the
    folder, the bytes needed and what to do."""


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, is ENOSPC or EDQUOT
    (torch.save reports a failed write as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


NAME_LIMIT = 80  # characters of one name from a dataset quoted in a message (a class name may be megabytes)


def shortened(value: object, limit: int = NAME_LIMIT) -> str:
    """`value`'s text cut to `limit` characters with an ellipsis (for text that is not quoted)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def quoted(value: object, limit: int = NAME_LIMIT) -> str:
    """`value` quoted (repr of its text) for a message, cut to about `limit` characters with an ellipsis."""
    text = str(value)
    shown = repr(text[:limit])
    if len(text) <= limit and len(shown) <= limit + 2:
        return shown
    return shown[:limit - 4] + shown[0] + "..."  # escapes may lengthen it: the quote closed, then the ellipsis


def summary(items: Collection[object], what: str, plural: str | None = None, *, show: int = 1) -> str:
    """A list from user data as a message gives it: its count and its first `show` items, each quoted
    and shortened ("3 duplicate class names, the first: 'cat'"), never the whole list."""
    many = plural or f"{what}s"
    if not items:
        return f"no {many}"
    first = ", ".join(quoted(item) for item in itertools.islice(items, show))
    if len(items) == 1:
        return f"1 {what}: {first}"
    if len(items) <= show:
        return f"{len(items):,} {many}: {first}"
    head = "the first" if show == 1 else f"the first {min(show, len(items))}"
    return f"{len(items):,} {many}, {head}: {first}" + (", ..." if 1 < show < len(items) else "")


def plain(text: object, limit: int = 200) -> str:
    """Text from a dataset (a class or file name, a reason) as a terminal line shows it: control and
    other unprintable characters as escapes (none reaches the terminal), cut to about `limit` characters."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def counted(n: float, word: str, plural: str | None = None) -> str:
    """'1 shard', '2 shards', '3 classes' (with `plural` given), '0.5 CPUs' (a float as %g)."""
    shown = f"{n:g}" if isinstance(n, float) else f"{n}"
    return f"{shown} {word if n == 1 else plural or word + 's'}"


def human_size(n: float) -> str:
    """A byte count for people: 512 B, 1.5 KB, 2.3 GB (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return str(n)
