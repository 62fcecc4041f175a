"""A local Ray of datapipe's own (backend="ray" with no Ray connected, convert --engine ray with no
address): it binds and advertises 127.0.0.1 only; its files go to a new folder of its own, mode 0700
(Ray makes each folder it uses world-writable: they sit one level down), short enough for Ray's socket
paths, removed when it stops (`stop_local`, or at exit); its object store is sized to what this
machine lets it map (`store_bytes`), and a Ray that still cannot start is one line naming what its
processes logged. Light: no torch."""
from __future__ import annotations

import atexit
import logging
import os
import re
import resource
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ExpectedError, first_line, shortened
from .ray_setup import LOOPBACK, loopback_only, quiet_token_notice, token_file_problem

log = logging.getLogger(__name__)

MIN_STORE = 75 << 20  # Ray's smallest object store (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES)
STORE_SHARE = 0.3  # Ray's default: 30% of the memory available
SHM_SHARE = 0.95  # of /dev/shm's free space, as Ray leaves some (below MIN_STORE there, Ray uses /tmp)
# The address space a Ray worker maps besides the object store (it maps the whole store): measured here,
# 1.3 GiB for a Ray worker, 2 GiB with torch imported. What is left under ulimit -v, halved for growth, is the store.
WORKER_ADDRESS_SPACE = 2 << 30
SOCKET_PATH = 107  # AF_UNIX's limit on a socket's path
SESSION_TAIL = 64  # "/session_<date>_<time>_<us>_<pid>/sockets/plasma_store" after Ray's temp folder
PREFIX = "ray-dp-"  # mkdtemp adds 8 characters
RAY_FOLDER = "r"  # Ray's own temp folder inside ours: Ray makes each folder it uses world-writable, ours stays 0700
FATAL = re.compile(r"^\[\S+ \S+ ([EC]) \d+ \d+\] \((\w+)\) \S+:\d+: +(.+)$")  # Ray's error and fatal log lines
_running: list[Path] = []  # the folder of the local Ray this process started, while it runs


class LocalRayFailed(ExpectedError):
    """The local Ray could not start here (one line: the cause and what to do)."""


@dataclass(frozen=True)
class Limits:
    """What bounds a local Ray's object store on this machine."""

    available: int  # bytes of memory available (Ray's reading: the machine's, or its cgroup's limit less its use)
    shm_free: int  # bytes free in /dev/shm (0: none)
    address_space: int | None  # RLIMIT_AS's soft limit, bytes (None: unlimited)

    def __str__(self) -> str:
        limit = "no ulimit -v" if self.address_space is None else f"ulimit -v {gib(self.address_space)}"
        return f"{limit}, /dev/shm {gib(self.shm_free)} free, {gib(self.available)} of memory available"


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def read_limits() -> Limits:
    """This process's limits now."""
    try:
        from ray._private.utils import estimate_available_memory  # Ray's own reading, cgroups v1 and v2
        available = int(estimate_available_memory())
    except Exception:  # Ray's private helper gone: the machine's figure
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        shm = os.statvfs("/dev/shm")
        shm_free = shm.f_bavail * shm.f_frsize
    except OSError:
        shm_free = 0
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return Limits(available, shm_free, None if soft == resource.RLIM_INFINITY else soft)


def store_bytes(limits: Limits) -> int:
    """The object store a local Ray gets: Ray's default (30% of the memory available), at most 95% of
    /dev/shm's free space (where that holds Ray's minimum), and, under ulimit -v, half of what a worker
    leaves of the address space (every Ray process maps the whole store). LocalRayFailed under 75 MiB."""
    size = int(limits.available * STORE_SHARE)
    if limits.shm_free * SHM_SHARE >= MIN_STORE:
        size = min(size, int(limits.shm_free * SHM_SHARE))
    if limits.address_space is not None:
        size = min(size, (limits.address_space - WORKER_ADDRESS_SPACE) // 2)
    if size < MIN_STORE:
        raise LocalRayFailed(f"a local Ray cannot start here: its object store would get {max(size, 0) >> 20} MiB, "
                             f"under the {MIN_STORE >> 20} MiB Ray needs ({limits}); raise ulimit -v or free memory, "
                             "or join a running cluster (RAY_ADDRESS, --ray-address)")
    return size


def session_folder() -> Path:
    """A new private folder for a local Ray's files: under the temp folder where Ray's socket paths
    fit there (a Slurm job's $TMPDIR is often too long), else under /tmp."""
    base = tempfile.gettempdir()
    if len(base) + 1 + len(PREFIX) + 8 + 1 + len(RAY_FOLDER) + SESSION_TAIL > SOCKET_PATH:
        log.info("Ray's socket paths under %s would be too long for AF_UNIX: its files go under /tmp", base)
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))


def start_local(ray: Any, **options: Any) -> None:
    """Start a Ray on this machine for this process: it reads no RAY_ADDRESS (address="local"), binds and
    advertises 127.0.0.1 only, keeps its files in a folder of its own and sizes its object store to
    this machine (unless `object_store_memory` is given). Nothing else can reach it."""
    if problem := token_file_problem(turned_on=True):  # a Ray of its own turns token authentication on
        raise LocalRayFailed(f"a local Ray cannot start: {problem}")
    limits = read_limits()
    options.setdefault("object_store_memory", store_bytes(limits))
    folder = session_folder()
    try:
        with loopback_only(), quiet_token_notice():
            ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False, logging_level=logging.WARNING,
                     _temp_dir=str(folder / RAY_FOLDER), **options)
    except Exception as exc:
        raise _failed(ray, folder, exc, limits, options["object_store_memory"]) from None
    _running.append(folder)
    atexit.register(stop_local, ray)  # after Ray's own hook: runs before it


def stop_local(ray: Any) -> None:
    """Shut down the local Ray start_local started and remove its folder (what it created, nothing else)."""
    if not _running:
        return
    if ray.is_initialized():
        ray.shutdown()
    while _running:
        shutil.rmtree(_running.pop(), ignore_errors=True)
    atexit.unregister(stop_local)


def _failed(ray: Any, folder: Path, exc: Exception, limits: Limits, store: int) -> LocalRayFailed:
    """The one line for a local Ray that did not start: what its processes logged (its folder removed),
    else Ray's error and where the logs are (its folder kept)."""
    try:
        ray.shutdown()  # whatever did start (a Ray whose node never came up is not Ray's to stop)
    except Exception as stop:
        log.debug("datapipe: stopping a Ray that did not start: %s", stop)
    _kill_left(folder)
    sizes = f"object store {gib(store)}; {limits}"
    cause = startup_cause(folder)
    if cause is None:
        return LocalRayFailed(f"a local Ray could not start: {first_line(exc)} ({sizes}); its logs: {folder}")
    shutil.rmtree(folder, ignore_errors=True)
    return LocalRayFailed(f"a local Ray could not start: {cause} ({sizes}); raise ulimit -v or free memory or "
                          "/dev/shm, or join a running cluster (RAY_ADDRESS, --ray-address)")


def _kill_left(folder: Path) -> None:
    """Kill the processes a Ray that did not start left running (its GCS, its log monitor): those whose
    command line names its folder, a new random one only they and this process know."""
    mark = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue


def startup_cause(folder: Path) -> str | None:
    """The first error a Ray process logged in `folder` ("raylet: mmap failed with error: Cannot allocate
    memory"), else the first fatal one's failed check; None when none logged one."""
    fatal = None
    for path in sorted(folder.glob(f"{RAY_FOLDER}/session_*/logs/*.out")):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            found = FATAL.match(line)
            if found and found[1] == "E":
                return shortened(_printable(f"{found[2]}: {found[3]}"), 200)
            if found and fatal is None:
                fatal = f"{found[2]}: {found[3].partition('Check failed: ')[2] or found[3]}"
    return None if fatal is None else shortened(_printable(fatal), 200)


def _printable(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", text)
