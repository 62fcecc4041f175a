"""Which Ray the pool runs on: the one this process is connected to (`ray.init(address=...)` before
make_loader; datapipe's CLI does it from RAY_ADDRESS), else `ray.init()`, which joins RAY_ADDRESS's
cluster when it is set and otherwise starts a local Ray bound to 127.0.0.1. A Ray this module started
is shut down with the loader (`owned`): no Ray process outlives it."""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
# Ray's sockets live at TEMP/ray/session_<date>_<time>_<pid>/sockets/plasma_store: ~75 characters after
# TEMP, and a socket's path may hold 107 (as converters/engines/ray.py; datapipe does not import converters)
SHORT_TEMP = 32


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("backend='ray' needs Ray in this process and on every node: pip install 'datapipe[ray]'") from exc
    return ray


def _temp_options() -> dict[str, str]:
    temp = tempfile.gettempdir()
    if len(temp) <= SHORT_TEMP:
        return {}
    return {"_temp_dir": f"/tmp/ray-{os.getuid()}"}


def connect() -> tuple[Any, bool]:
    """(the ray module, whether this call started the Ray it is connected to)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    ray.init(_node_ip_address=LOOPBACK, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, **_temp_options())
    log.info("datapipe: the Ray pool runs on a Ray started for this loader (stopped with it)")
    return ray, True


def shutdown(ray: Any, owned: bool) -> None:
    """Stop the Ray this loader started (a Ray the process was already connected to is left alone)."""
    if owned and ray.is_initialized():
        ray.shutdown()
