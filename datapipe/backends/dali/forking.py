"""A process forked while DALI pipelines exist must never shut those pipelines down.

A forked child (a DataLoader worker of another loader in the same process, a `call_in_child`
helper) inherits Python copies of the parent's DALI pipelines but none of their threads. When the
child's garbage collector reaches one (a loader left in a reference cycle), `Pipeline.__del__`
calls the C++ `Shutdown`, which waits for those threads forever: the worker hangs, and the
DataLoader with it (seen in this test suite). So after a fork the child keeps a reference to every
live pipeline: it never collects them, and it exits without running their finalizers (forked
workers leave through `os._exit`).
"""
from __future__ import annotations

import os
import weakref

_pipelines: weakref.WeakSet = weakref.WeakSet()  # every pipeline datapipe built in this process
_inherited: list = []  # in a forked child: the pipelines it inherited, never collected


def track(pipeline):
    """Register a pipeline so that forked children keep it; returns it."""
    _pipelines.add(pipeline)
    return pipeline


def _keep_inherited_pipelines() -> None:
    _inherited.extend(_pipelines)


os.register_at_fork(after_in_child=_keep_inherited_pipelines)
