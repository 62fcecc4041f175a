"""The tar (USTAR) pieces WebDataset shards need: member headers, DALI `.idx` lines, and reading the
members of one sample back out of the bytes of its span.

Shards may come from strangers, so the header walk (`walk_tar`) trusts nothing it reads: every size
must fit in the file, extended headers (PAX, GNU long names) are read only up to `MAX_EXTENDED`, a
damaged header is an error naming the shard and the byte, and a member whose name breaks the
dataset name rule (`datapipe.names`: `../x.jpg`, `/x.jpg`) is skipped with its reason. Memory stays
bounded by the shard's size.
"""
from __future__ import annotations

import logging
import os

from ..errors import quoted
from ..names import UnsafeName, check_name

BLOCK = 512
MTIME = 946684800  # 2000-01-01: fixed so identical input gives identical shards
IDX_VERSION = "v1.2"
END_OF_ARCHIVE = 2 * BLOCK
MAX_EXTENDED = 1 << 20  # a PAX or GNU long-name header holds names and attributes: never megabytes
_REGULAR = (b"0", b"\0", b"7")
_EXTENDED = (b"x", b"g", b"L", b"K")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")

Component = tuple[str, int, int, str]  # (ext, data offset, size, member name)
log = logging.getLogger(__name__)


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


def damaged(where: str, offset: int, what: str) -> ValueError:
    """The one-line error for a tar that cannot be walked past `offset`."""
    return ValueError(f"{where}: {what} at byte {offset}; the shard is damaged or not a tar (re-fetch or "
                      "repack it)")


def header_number(field: bytes) -> int | None:
    """A numeric header field (octal, or GNU base-256 when its first byte is 0x80); None when it is
    neither or negative."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text.strip(b"01234567"):
        return None
    return int(text or b"0", 8)


def member_size(header: bytes, where: str, offset: int) -> int:
    size = header_number(header[124:136])
    if size is None:
        raise damaged(where, offset, f"size field {header[124:136]!r} is not a size")
    return size


def member_name(name: str) -> str:
    """A member's name without the leading `./` that `tar -cf x.tar .` writes."""
    while name.startswith("./"):
        name = name[2:]
    return name


def name_problem(name: str) -> str | None:
    """Why a member name must not become a sample key (None: it may): the dataset name rule."""
    try:
        check_name(name, "tar member name")
    except UnsafeName as exc:
        return str(exc)
    return None


def members(blob: bytes, where: str) -> dict[str, tuple[str, bytes]]:
    """The regular-file members in `blob` (whole members, header first): ext -> (member name, data).
    `where` names the blob in errors; two members of one extension are one (a sample of this
    project's shards has one of each)."""
    out, pos = {}, 0
    while pos + BLOCK <= len(blob):
        header = blob[pos:pos + BLOCK]
        if header[257:262] != b"ustar" or not header[:1].strip(b"\0"):
            raise ValueError(f"{where}: no tar header at byte {pos} of the sample; the shard is damaged "
                             "or its index is stale (run `datapipe verify`)")
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        size = member_size(header, where, pos)
        start = pos + BLOCK
        if start + size > len(blob):
            raise ValueError(f"{where}: member {name} runs past the sample's span; the shard is damaged")
        ext = name.rsplit("/", 1)[-1].split(".", 1)[-1]
        if header[156:157] in (b"0", b"\0"):
            if ext in out:
                raise ValueError(f"{where}: members {quoted(out[ext][0])} and {quoted(name)} share the extension "
                                 f"{quoted(ext)} in one sample; the shard is damaged or was crafted")
            out[ext] = (name, blob[start:start + size])
        pos = start + padded(size)
    return out


def parse_idx(text: str, *, where: str = "index", shard_bytes: int | None = None) -> list[list[Component]]:
    """DALI index lines -> per sample, its components as (ext, offset, size, member name). With
    `shard_bytes` (the tar's size) every member must lie inside the tar; a line the tar cannot hold,
    or a sample count the lines do not match, is an error naming `where` and the line."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if not head or head[0] != IDX_VERSION:
        raise ValueError(f"{where}: not a DALI {IDX_VERSION} index (first line {quoted(lines[0] if lines else '')})")
    if len(head) > 1 and head[1] != str(len(lines) - 1):
        raise ValueError(f"{where}: claims {head[1][:20]} samples but lists {len(lines) - 1}; the index is "
                         "damaged (delete it: the shard is then indexed from its headers)")
    limit = float("inf") if shard_bytes is None else shard_bytes
    tar = "" if shard_bytes is None else f" of the {shard_bytes}-byte tar"
    samples = []
    for number, line in enumerate(lines[1:], 2):
        f = line.split()
        ok = f and len(f) % 4 == 0 and all(f[i].isdigit() and f[i + 1].isdigit() for i in range(1, len(f), 4))
        parts = [(f[i], int(f[i + 1]), int(f[i + 2]), f[i + 3]) for i in range(0, len(f), 4)] if ok else []
        bad = next((p for p in parts if p[1] < BLOCK or p[1] + p[2] > limit or name_problem(member_name(p[3]))), None)
        if not ok or bad:
            what = f"member {bad[3]!r} at {bad[1]}+{bad[2]} bytes" if bad else repr(line[:60])
            raise ValueError(f"{where}: line {number} ({what}) does not describe a member{tar}; the index is "
                             "damaged (delete it: the shard is then indexed from its headers)")
        samples.append(parts)
    return samples


def _pax(data: bytes, where: str, offset: int) -> dict[str, bytes]:
    """The records (`LEN key=value\\n`) of a PAX extended header's data."""
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 20)
        length = int(data[pos:space]) if space > pos and data[pos:space].isdigit() else 0
        record = data[pos:pos + length]
        key, eq, value = record[space - pos + 1:-1].partition(b"=")
        if length <= space - pos or pos + length > len(data) or not record.endswith(b"\n") or not eq:
            raise damaged(where, offset, f"PAX record {data[pos:pos + 40]!r} is malformed")
        out[key.decode("utf-8", "replace")] = value
        pos += length
    return out


def _member(header: bytes, size: int, pax: dict[str, bytes], longname: bytes | None, where: str,
            start: int) -> tuple[str | None, int, str | None]:
    """(name, size, skip reason) of a regular member whose headers begin at `start` (its PAX and GNU
    long-name headers applied), or an error when its size cannot be trusted."""
    if "size" in pax:
        text = pax["size"]
        size = int(text) if text.isdigit() and len(text) < 20 else -1
        if size < 0:
            raise damaged(where, start, f"PAX size {text[:20]!r} is not a size")
    raw = pax.get("path") or longname or header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0]
    if "path" not in pax and longname is None and prefix and header[257:263] == b"ustar\0":
        raw = prefix + b"/" + raw
    try:
        name = member_name(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, size, f"tar member name {raw[:60]!r} is not UTF-8"
    if name.endswith("/"):  # an old-style folder entry: no sample, no warning
        return name, size, None
    if any(key.startswith("GNU.sparse.") for key in pax):
        return name, size, f"tar member {name!r} is a sparse file, which datapipe does not read"
    return name, size, name_problem(name)


def walk_tar(path: str, *, span: tuple[int, int] | None = None) -> tuple[list[tuple[str, int, int]], list[str]]:
    """The regular-file members of a tar from its headers alone: (name, data offset, size) each, and
    the members skipped, each as 'byte N: reason'. A header that cannot be trusted is an error.
    `span` (first byte, end byte): the tar stored in that range of the file, e.g. a member of an outer
    tar (converters.imagenet); offsets stay the file's."""
    found: list[tuple[str, int, int]] = []
    skipped: list[str] = []
    _walk(path, span, found, skipped)
    return found, skipped


def walk_tar_until_damage(path: str) -> tuple[list[tuple[str, int, int]], list[str], str | None]:
    """`walk_tar`, keeping the members before a header that cannot be trusted (a shard cut short):
    (members, skipped, the damage's one-line error or None)."""
    found: list[tuple[str, int, int]] = []
    skipped: list[str] = []
    try:
        ended = _walk(path, None, found, skipped)
    except ValueError as exc:
        return found, skipped, str(exc)
    if not ended:  # tar writers end with zero blocks: a file cut at a member's boundary lacks them
        return found, skipped, damaged(path, os.path.getsize(path), "no end-of-archive blocks").args[0]
    return found, skipped, None


def _walk(path: str, span: tuple[int, int] | None, found: list[tuple[str, int, int]], skipped: list[str]) -> bool:
    """walk_tar's header walk, appending to `found` and `skipped` as it goes (kept when it raises);
    whether it met the end-of-archive blocks."""
    pax_global: dict[str, bytes] = {}
    pax: dict[str, bytes] = {}
    longname: bytes | None = None
    fd = os.open(path, os.O_RDONLY)
    try:
        end, offset = os.fstat(fd).st_size, 0
        if span is not None:
            offset, end = span[0], min(span[1], end)
        start = offset  # the member's first (extended) header
        while offset < end:
            header = os.pread(fd, min(BLOCK, end - offset), offset)
            if len(header) < BLOCK:
                raise damaged(path, offset, f"the file ends inside a tar header ({end} bytes)")
            if not header.strip(b"\0"):
                return True  # end of archive
            stored, rest = header_number(header[148:156]), header[:148] + b" " * 8 + header[156:]
            if stored != sum(rest) and stored != sum(rest) - 256 * sum(b > 127 for b in rest):  # tarfile's two sums
                raise damaged(path, offset, "a tar header fails its checksum")
            kind, size = header[156:157], member_size(header, path, offset)
            if kind in _EXTENDED:
                if size > MAX_EXTENDED or offset + BLOCK + size > end:
                    raise damaged(path, offset, f"extended header ({kind.decode('latin-1')!r}) claims {size} bytes "
                                  f"(at most {MAX_EXTENDED}, and inside the file's {end})")
                data = os.pread(fd, size, offset + BLOCK)
                if kind in b"xg":
                    (pax if kind == b"x" else pax_global).update(_pax(data, path, offset))
                elif kind == b"L":
                    longname = data.split(b"\0", 1)[0]
                offset += BLOCK + padded(size)
                continue
            if kind == b"S":
                raise damaged(path, start, "a GNU sparse member, which datapipe does not read")
            name, reason = None, None
            if kind in _REGULAR:
                name, size, reason = _member(header, size, {**pax_global, **pax}, longname, path, start)
            elif kind in _NO_DATA:  # links, folders, devices: like tarfile, no data follows
                size = 0
            if offset + BLOCK + size > end:
                raise damaged(path, start, f"member claims {size} bytes past the end of the file ({end} bytes)")
            if reason:
                skipped.append(f"byte {start}: {reason}")
            elif name and not name.endswith("/"):
                found.append((name, offset + BLOCK, size))
            pax, longname = {}, None
            offset = start = offset + BLOCK + padded(size)
    finally:
        os.close(fd)
    return False


def scan_tar(path: str) -> list[list[Component]]:
    """Index a tar from its headers alone (the data is never read): per sample (webdataset grouping:
    same name up to the first dot of the basename, consecutive), its components. Skipped members
    (and samples whose members repeat an extension) are logged with their reasons."""
    found, skipped = walk_tar(path)
    samples, repeated = group_samples(found)
    skipped += repeated
    if skipped:
        log.warning("%s: skipped %d tar member(s), first %s", path, len(skipped), "; ".join(skipped[:3]))
    return samples


def samples_before_damage(path: str) -> tuple[list[list[Component]], list[str], str | None]:
    """A shard's samples (group_samples) up to a header that cannot be trusted (a shard cut short),
    the members skipped ('byte N: reason', then the samples group_samples refused), and the damage's
    one-line error or None. The last sample before the damage goes with it: what was cut may be its
    label, caption or metadata, and nothing says which members a sample should have (at most one
    whole sample is lost)."""
    found, skipped, damage = walk_tar_until_damage(path)
    groups, repeated = group_samples(found, cut=damage is not None)
    return groups, skipped + repeated, damage


def group_samples(found: list[tuple[str, int, int]], *, cut: bool = False) -> tuple[list[list[Component]], list[str]]:
    """Members (name, data offset, size) grouped into samples as webdataset groups them: the same
    name up to the first dot of the basename, consecutive. A sample two of whose members share an
    extension (`K.jpg`, `K.txt`, `K.jpg`) is refused whole (distinct_members): (samples, reasons).
    `cut`: the tar was cut short after `found`, whose last sample is dropped (it may lack members)."""
    samples: list[list[Component]] = []
    last = None
    for name, offset, size in found:
        folder, _, base = name.rpartition("/")
        if "." not in base or base.startswith("."):
            continue
        stem, ext = base.split(".", 1)
        key = f"{folder}/{stem}" if folder else stem
        if key != last:
            samples.append([])
            last = key
        samples[-1].append((ext, offset, size, name))
    if cut and samples:
        samples.pop()
    return distinct_members(samples)


def distinct_members(samples: list[list[Component]]) -> tuple[list[list[Component]], list[str]]:
    """The samples whose members' extensions are distinct, and a reason for each other one. Two
    `.jpg` members under one key are two images with one caption and label: which one the caption
    describes cannot be told, so the sample is not read. (webdataset 1.0 raises "duplicate file name"
    on such a tar, ending the pass, or with a warn-and-continue handler keeps the first image with the
    caption and drops the second; a dict keyed by extension kept the second with the first's caption.)"""
    kept, refused = [], []
    for sample in samples:
        reason = repeated_extension(sample)
        if reason is None:
            kept.append(sample)
        else:
            refused.append(reason)
    return kept, refused


def repeated_extension(sample: list[Component]) -> str | None:
    """Why `sample` cannot be read when two of its members share an extension ('byte N: reason',
    naming both members), else None."""
    seen: dict[str, tuple[int, str]] = {}
    for ext, offset, _, name in sample:
        if ext in seen:
            at, first = seen[ext]
            return (f"byte {at}: members {quoted(first)} and {quoted(name)} (data at bytes {at} and {offset}) "
                    f"share the extension {quoted(ext)} in one sample; which of them its other members go with "
                    "cannot be told, so the sample is not read (give each image its own key and repack the shard)")
        seen[ext] = (offset, name)
    return None


def sample_starts_from_headers(fd: int, end: int, samples: int, where: str) -> list[int]:
    """Where each sample of a shard this project wrote starts (its first member's header: what its
    `.idx` and its split's offsets file say), from the tar headers alone, one pread a member: bytes
    0..`end` (where the end-of-archive blocks begin) hold regular USTAR members, those of one key
    consecutive. A header that is not such a member, a member past `end`, or other than `samples`
    samples is an error naming `where`; the walk stops there, so its memory stays within `samples`."""
    starts: list[int] = []
    last, offset = None, 0
    while offset < end:
        header = os.pread(fd, BLOCK, offset)
        if len(header) < BLOCK or header[257:262] != b"ustar" or header[156:157] not in (b"0", b"\0"):
            raise damaged(where, offset, "no regular USTAR member header where a sample's member should be")
        folder, _, base = header[:100].split(b"\0", 1)[0].rpartition(b"/")
        key = (folder, base.split(b".", 1)[0])
        if key != last:
            if len(starts) == samples:
                raise ValueError(f"{where}: its tar headers hold more than the {samples} samples the manifest "
                                 "lists; the shard is damaged or was crafted")
            starts.append(offset)
            last = key
        offset += BLOCK + padded(member_size(header, where, offset))
    if offset != end or len(starts) != samples:
        raise ValueError(f"{where}: its tar headers hold {len(starts)} samples in {offset} bytes, the manifest "
                         f"{samples} in {end}; the shard is damaged or was crafted")
    return starts
