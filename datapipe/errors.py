"""The base of failures a user can cause and fix (bad data, bad options): the CLI prints their
message as one line and exits non-zero, without a traceback. Kept free of heavy imports."""
import errno


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
