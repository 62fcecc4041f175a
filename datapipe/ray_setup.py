"""What datapipe's two uses of Ray (backend="ray", convert --engine ray) share before a Ray starts:
the import, with how to install it, and how a local Ray of their own starts (127.0.0.1 only, a temp
folder short enough for Ray's socket paths). Light: no torch (a conversion's Ray workers import this)."""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

# Ray's sockets live at TEMP/ray/session_<date>_<time>_<pid>/sockets/plasma_store: ~75 characters after
# TEMP, and a socket's path may hold 107 (a Slurm job's $TMPDIR is often longer than SHORT_TEMP)
SHORT_TEMP = 32
# Ray on Linux takes the machine's routable address and listens on every interface unless this is 0
# (read by Ray's processes from the environment, and by the driver's ray_constants at import)
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


def import_ray(needed_by: str = "backend='ray'") -> Any:
    """The ray module; without Ray, ImportError naming `needed_by` and how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{needed_by} needs Ray in this process and on every node: pip install 'datapipe[ray]'") from exc
    return ray


def short_temp_options() -> dict[str, str]:
    """ray.init's `_temp_dir` for a local Ray where the temporary folder is too long for Ray's socket
    paths ("AF_UNIX path length cannot exceed 107 bytes"): /tmp/ray-UID then; else nothing."""
    temp = tempfile.gettempdir()
    if len(temp) <= SHORT_TEMP:
        return {}
    log.info("Ray's socket paths under %s would be too long for AF_UNIX: its files go to /tmp/ray-%d", temp, os.getuid())
    return {"_temp_dir": f"/tmp/ray-{os.getuid()}"}


def start_local(ray: Any, **options: Any) -> None:
    """Start a Ray on this machine for this process: it reads no RAY_ADDRESS (address="local"), binds and
    advertises 127.0.0.1 only, and puts its files where its socket paths fit. Nothing else can reach it."""
    with loopback_only():
        ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False, logging_level=logging.WARNING,
                 **short_temp_options(), **options)


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While a local Ray starts: it binds and advertises 127.0.0.1 only (restored after)."""
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[CLUSTER_SWITCH], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(CLUSTER_SWITCH, None)
        else:
            os.environ[CLUSTER_SWITCH] = saved_env
