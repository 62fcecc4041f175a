"""The tar (USTAR) pieces WebDataset shards need: member headers, DALI `.idx` lines, and reading the
members of one sample back out of the bytes of its span."""
from __future__ import annotations

BLOCK = 512
MTIME = 946684800  # 2000-01-01: fixed so identical input gives identical shards
IDX_VERSION = "v1.2"
END_OF_ARCHIVE = 2 * BLOCK

Component = tuple[str, int, int, str]  # (ext, data offset, size, member name)


def padded(size: int) -> int:
    """A member's data size rounded up to whole blocks."""
    return size + (-size % BLOCK)


def member_header(name: str, size: int) -> bytes:
    """A USTAR header for a regular file (mode 644, uid/gid 0, fixed mtime): what
    `tarfile.TarInfo.tobuf(USTAR_FORMAT)` writes, at a fraction of its cost on the write path."""
    raw = name.encode("ascii")
    if len(raw) > 100:
        raise ValueError(f"member name {name!r} is longer than USTAR's 100 bytes")
    head = b"".join((raw.ljust(100, b"\0"), b"0000644\0", b"0000000\0", b"0000000\0", b"%011o\0" % size,
                     b"%011o\0" % MTIME, b" " * 8, b"0", b"\0" * 100, b"ustar\x0000", b"\0" * 32, b"\0" * 32,
                     b"\0" * 16, b"\0" * 155)).ljust(BLOCK, b"\0")
    checksum = b"%06o\0 " % sum(head)
    return head[:148] + checksum + head[156:]


def members(blob: bytes, where: str) -> dict[str, tuple[str, bytes]]:
    """The regular-file members in `blob` (whole members, header first): ext -> (member name, data).
    `where` names the blob in errors."""
    out, pos = {}, 0
    while pos + BLOCK <= len(blob):
        header = blob[pos:pos + BLOCK]
        if header[257:262] != b"ustar" or not header[:1].strip(b"\0"):
            raise ValueError(f"{where}: no tar header at byte {pos} of the sample; the shard is damaged "
                             "or its index is stale (run `datapipe verify`)")
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        size = int(header[124:136].strip(b" \0") or b"0", 8)
        start = pos + BLOCK
        if start + size > len(blob):
            raise ValueError(f"{where}: member {name} runs past the sample's span; the shard is damaged")
        if header[156:157] in (b"0", b"\0"):
            out[name.rsplit("/", 1)[-1].split(".", 1)[-1]] = (name, blob[start:start + size])
        pos = start + padded(size)
    return out


def parse_idx(text: str) -> list[list[Component]]:
    """DALI index lines -> per sample, its components as (ext, offset, size, member name)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(IDX_VERSION):
        raise ValueError(f"not a DALI {IDX_VERSION} index (first line {lines[:1]!r})")
    samples = []
    for line in lines[1:]:
        f = line.split()
        samples.append([(f[i], int(f[i + 1]), int(f[i + 2]), f[i + 3]) for i in range(0, len(f), 4)])
    return samples


def scan_tar(path: str) -> list[list[Component]]:
    """Index a tar from its headers alone (tarfile seeks over the data): per sample (webdataset
    grouping: same name up to the first dot of the basename, consecutive), its components."""
    import tarfile

    samples: list[list[Component]] = []
    last = None
    with tarfile.open(path, "r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, base = member.name.rpartition("/")
            if "." not in base or base.startswith("."):
                continue
            stem, ext = base.split(".", 1)
            key = f"{folder}/{stem}" if folder else stem
            if key != last:
                samples.append([])
                last = key
            samples[-1].append((ext, member.offset_data, member.size, member.name))
    return samples
