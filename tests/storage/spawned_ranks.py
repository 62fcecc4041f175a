"""What the processes of tests/storage/test_spawned_ranks.py run: module-level functions, so that
`spawn` and `forkserver` children can import them by name."""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path


def read_epoch(rank: int, world: int, url: str, out: str, backend: str, start_method: str | None,
               environ: dict[str, str] | None = None) -> None:
    """One rank: one epoch of `url` through 2 workers started by `start_method` (None: as this rank
    was); writes [[index, label], ...] served (or the error) to out/rank{rank}.json. `environ` is
    set first (a forkserver's children get the environment the server started with, not the test's)."""
    os.setpgrp()  # the test kills this rank with every process it started, should it hang
    os.environ.update(environ or {})
    result: dict = {"rank": rank, "pid": os.getpid()}
    try:
        from datapipe import make_loader

        loader = make_loader(url, backend=backend, rank=rank, world_size=world, num_workers=2, batch_size=4,
                             image_size=16, device="cpu", start_method=start_method)
        served = []
        for batch in loader:
            served += zip(batch.indices.tolist(), batch.labels.tolist())
        result["served"] = served
    except BaseException:
        result["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def direct_then_fork(url: str, name: str, out: str) -> None:
    """A process that calls the store directly (it said it forks nothing), then forks anyway: the
    child's direct call writes what it raised, or 'read' should it get the bytes, to `out`."""
    os.setpgrp()
    from datapipe.storage import RemoteStore
    from datapipe.storage.isolate import forks_nothing

    forks_nothing()
    store = RemoteStore(url)
    store.read(name)  # this process's obstore runtime runs from here on
    pid = os.fork()
    if pid == 0:
        forks_nothing()  # the child says so too: its call goes to obstore directly
        try:
            store.read(name)
            outcome = "read"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        Path(out).write_text(outcome)
        os._exit(0)
    os.waitpid(pid, 0)
