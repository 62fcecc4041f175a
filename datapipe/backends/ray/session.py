"""Which Ray the pool runs on: the one this process is connected to (`ray.init(address=...)` before
make_loader; datapipe's CLI does it from RAY_ADDRESS), else `ray.init()`, which joins RAY_ADDRESS's
cluster when it is set and otherwise starts a local Ray bound to 127.0.0.1. A Ray this module started
is shut down with the loader (`owned`): no Ray process outlives it."""
from __future__ import annotations

import logging
from typing import Any

from ...ray_setup import import_ray, short_temp_options

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"


def connect() -> tuple[Any, bool]:
    """(the ray module, whether this call started the Ray it is connected to)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    ray.init(_node_ip_address=LOOPBACK, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, **short_temp_options())
    log.info("datapipe: the Ray pool runs on a Ray started for this loader (stopped with it)")
    return ray, True


def shutdown(ray: Any, owned: bool) -> None:
    """Stop the Ray this loader started (a Ray the process was already connected to is left alone)."""
    if owned and ray.is_initialized():
        ray.shutdown()
