"""The errors a conversion stops with; each message names the file, shard or option and what to do."""
from __future__ import annotations


class ConvertError(ValueError):
    """A conversion that cannot go on; the message says which file or option and what to do."""


class StrictStop(ConvertError):
    """--strict met a bad file: nothing written is worth resuming."""


class ShardFailed(ConvertError):
    """A shard task failed for a reason other than a bad input file (the disk, the store, a bug);
    what was committed stays for --resume."""


class WorkerDied(ConvertError):
    """A worker process died (killed by a signal, e.g. by the out-of-memory killer, or crashed); the
    message names what it was doing, and what was finished stays for --resume."""
