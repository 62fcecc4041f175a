"""Where the shard cache lives by default, and a warning when it is on a network filesystem.

A cache must be node-local: its locks (flock) and the PIDs in its ownership marks mean nothing to
another node, and a limit on a folder every node mounts would be one limit for all of them. Cluster
homes are usually NFS, so the default is not ~/.cache (pip's and torch hub's choice) but the node's
temporary folder, as Streaming (/tmp/streaming) does: $TMPDIR, which batch schedulers (Slurm, PBS)
often point at node-local scratch, else /tmp. Give `cache_dir=` a local NVMe disk on a real node.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs",
    "pvfs2", "fuse.sshfs", "fuse.ceph", "fuse.glusterfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.juicefs",
    "fuse.mount-s3", "fuse.rclone"})
_warned: set[str] = set()


def default_cache_dir() -> Path:
    """$TMPDIR/datapipe-<uid>, else /tmp/datapipe-<uid>: node-local (see the module docstring)."""
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"datapipe-{os.getuid()}"


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
