"""Where the shard cache lives by default, that it is this user's own, and a warning when it is on a
network filesystem.

A cache must be node-local: its locks (flock) and the PIDs in its ownership marks mean nothing to
another node, and a limit on a folder every node mounts would be one limit for all of them. Cluster
homes are usually NFS, so the default is not ~/.cache (pip's and torch hub's choice) but the node's
temporary folder, as Streaming (/tmp/streaming) does: $TMPDIR, which batch schedulers (Slurm, PBS)
often point at node-local scratch, else /tmp. Give `cache_dir=` a local NVMe disk on a real node.

That name is predictable, and /tmp is everyone's: another user could make the folder first (or a
symbolic link there) and plant copies and indexes that datapipe would serve. So a cache folder,
default or given, is made 0700, and one that is not this user's own, or that others could change, is
refused (`own_folder`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from ..errors import ExpectedError

log = logging.getLogger(__name__)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs",
    "pvfs2", "fuse.sshfs", "fuse.ceph", "fuse.glusterfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.juicefs",
    "fuse.mount-s3", "fuse.rclone"})
_warned: set[str] = set()
FIX = "give cache_dir= (--cache-dir) a folder of yours that only you can write to"


class UnsafeCacheDir(ExpectedError):
    """A cache folder that another user owns or could change: what it holds cannot be trusted."""


def default_cache_dir() -> Path:
    """$TMPDIR/datapipe-<uid>, else /tmp/datapipe-<uid>: node-local (see the module docstring); made
    0700 if missing, tightened to 0700 if an older datapipe made it readable, refused unless it is ours."""
    folder = Path(os.environ.get("TMPDIR") or "/tmp") / f"datapipe-{os.getuid()}"
    try:
        own_folder(folder, fix=f"{FIX}, or point TMPDIR at one")
    except OSError as exc:  # it cannot be made (TMPDIR read-only or missing): nothing there to trust, and
        log.debug("no cache folder %s: %s", folder, exc)  # what would write there fails as it did
        return folder
    if stat.S_IMODE(os.stat(folder).st_mode) & 0o077:
        os.chmod(folder, 0o700)
    return folder


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _others_can_write(st: os.stat_result) -> bool:
    """Group or others may create, rename or delete entries (the sticky bit, as on /tmp, stops them
    touching entries they do not own)."""
    return bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX


def own_folder(folder: Path, fix: str = FIX) -> Path:
    """`folder`, made (0700) if missing; `UnsafeCacheDir` unless this user owns it, no one else may
    write to it, and no folder above it lets others replace it. A symbolic link is followed only if
    this user made it. OSError where it cannot be made (read-only, a file in the way)."""
    folder = Path(folder)
    try:
        os.mkdir(folder, 0o700)
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    me, link = os.getuid(), os.lstat(folder)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != me:
        raise UnsafeCacheDir(f"the cache folder {folder} is a symbolic link made by {_owner(link.st_uid)}, not by "
                             f"you ({_owner(me)}): it could point anywhere; {fix}, or remove the link")
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(20, "the cache folder is not a folder", str(folder))
    if st.st_uid != me:
        raise UnsafeCacheDir(f"the cache folder {folder} belongs to {_owner(st.st_uid)}, not to you ({_owner(me)}): "
                             f"they could plant the files it serves; {fix}")
    if st.st_mode & 0o022:
        raise UnsafeCacheDir(f"the cache folder {folder} is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): they could plant the files it serves; chmod 700 "
                             f"{folder}, or {fix}")
    real = Path(os.path.realpath(folder))
    for parent in real.parents:
        if _others_can_write(os.stat(parent)):
            raise UnsafeCacheDir(f"the cache folder {folder} is inside {parent}, which others may write to (mode "
                                 f"{stat.S_IMODE(os.stat(parent).st_mode):04o}, no sticky bit): they could replace "
                                 f"the cache folder; {fix}")
    return folder


def filesystem_type(path: Path, mounts: str | None = None) -> str:
    """The type of the filesystem holding `path` (the mount with the longest matching mount point),
    from /proc/self/mounts or the given text of it; "" when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return ""
    where = os.path.realpath(path)
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def warn_if_network(folder: Path, mounts: str | None = None) -> bool:
    """Log once per folder when it is on a network filesystem; True if it is."""
    kind = filesystem_type(folder, mounts)
    if kind not in NETWORK_FILESYSTEMS:
        return False
    if str(folder) not in _warned:
        _warned.add(str(folder))
        log.warning("the shard cache %s is on a network filesystem (%s): every node would share its limit, "
                    "and its locks may not work between nodes; give cache_dir= a node-local disk "
                    "(local NVMe, /tmp)", folder, kind)
    return True
