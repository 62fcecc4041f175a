"""Which Ray the pool runs on: the one this process is connected to (`ray.init(address=...)` before
make_loader; datapipe's CLI joins RAY_ADDRESS's cluster itself), else a local Ray started here
(`address="local"`: the library reads no environment) that listens on 127.0.0.1 only (ray_local.py). The loaders
that use a Ray started here share it, and the last of them to close shuts it down: no Ray process
outlives them, and none is stopped under a loader still using it."""
from __future__ import annotations

import logging
from typing import Any

from ...ray_local import start_local, stop_local
from ...ray_setup import import_ray

log = logging.getLogger(__name__)
_users = 0  # loaders using the Ray this module started (0: none started, or it was shut down)


def connect() -> tuple[Any, bool]:
    """(the ray module, whether this call holds a share of a Ray this module started)."""
    global _users
    ray = import_ray()
    if ray.is_initialized():
        if _users == 0:
            return ray, False  # the user's Ray: never stopped here
        _users += 1
        return ray, True
    start_local(ray, log_to_driver=False)
    _users = 1
    log.info("datapipe: the Ray pool runs on a local Ray started for it, on 127.0.0.1 (stopped with its last loader)")
    return ray, True


def shutdown(ray: Any, owned: bool) -> None:
    """Let go of a share of the Ray this module started; the last share shuts it down. A Ray the
    process was connected to otherwise is left alone."""
    global _users
    if not owned or _users == 0:
        return
    _users -= 1
    if _users == 0:
        stop_local(ray)  # and its folder removed
