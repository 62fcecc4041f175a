"""The node-wide shard cache under pressure (datapipe/storage/cache.py): many processes and threads
under a small limit with a store that fails 5% of requests, two hosts sharing one folder, a dataset
converted again to the same URL, files open in readers, a full disk, a cache on NFS."""
from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import logging
import multiprocessing
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from datapipe import make_loader, open_dataset
from datapipe.storage import CacheFull, RemoteStore, ShardCache, StoreError
from datapipe.storage.cache import STALE_PART_S
from datapipe.storage.cachedir import default_cache_dir, filesystem_type, warn_if_network
from datapipe.storage.isolate import call_in_child, forks_nothing
from tests.shard_tables import edit_shards
from tests.storage.conftest import serve, stop_serving, upload_folder

FILE_BYTES = 48 << 10
FILES = 10
PROCESSES, THREADS, READS = 8, 2, 12
DEADLINE_S = 120  # a healthy run takes a few seconds


class FlakyProxy:
    """An HTTP proxy on 127.0.0.1 in front of the S3 server that answers a share of requests with 503
    (obstore retries them), the rest forwarded unchanged."""

    def __init__(self, endpoint: str, drop: float, seed: int = 0) -> None:
        host, port = endpoint.removeprefix("http://").split(":")
        rng, lock, counts = random.Random(seed), threading.Lock(), {"forwarded": 0, "dropped": 0}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def relay(self) -> None:
                with lock:
                    dropped = rng.random() < drop
                    counts["dropped" if dropped else "forwarded"] += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if dropped:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                upstream = http.client.HTTPConnection(host, int(port), timeout=30)
                upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay

        self.counts = counts
        self.server = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        stop_serving(self.server)


def _read_randomly(url: str, root: str, limit: int, files: dict, seed: int, out: str) -> None:
    """One process: THREADS threads each open READS random files through the cache and check their
    bytes against the sha256; writes the errors it met (none expected) to `out`."""
    forks_nothing()  # this process forks nothing: it calls the store directly
    cache = ShardCache(RemoteStore(url), Path(root), limit, wait_s=DEADLINE_S / 2)
    errors: list[str] = []

    def reader(rng: random.Random) -> None:
        for _ in range(READS):
            name = rng.choice(sorted(files))
            try:
                fd = cache.open(name, size=files[name]["bytes"], sha256=files[name]["sha256"])
                try:
                    data = os.pread(fd, files[name]["bytes"] + 1, 0)
                finally:
                    os.close(fd)
                if hashlib.sha256(data).hexdigest() != files[name]["sha256"]:
                    errors.append(f"{name}: served bytes differ from the sha256")
            except Exception as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=reader, args=(random.Random(seed * 100 + t),)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    Path(out).write_text(json.dumps(errors))


class CacheWatcher:
    """Samples the cache folder while the readers run: the most bytes it ever held (whole copies and
    downloads in flight) and every lock file seen, by inode."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.locks, self.running = root, 0, {}, True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.running:
            total = 0
            for path in self.root.glob("*/*"):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if path.parent.name == ".locks":
                    self.locks.setdefault(path, st.st_ino)
                else:
                    total += st.st_size
            self.peak = max(self.peak, total)
            time.sleep(0.002)

    def stop(self) -> None:
        self.running = False
        self.thread.join()


def test_eight_processes_of_two_threads_under_a_three_file_limit_with_a_flaky_store(s3, tmp_path):
    url = s3.bucket("stress")
    rng = random.Random(7)
    files = {}
    for i in range(FILES):
        blob = rng.randbytes(FILE_BYTES)
        call_in_child(RemoteStore(url).upload, f"shard-{i:02d}.tar", blob)
        files[f"shard-{i:02d}.tar"] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    proxy = FlakyProxy(s3.endpoint, drop=0.05)
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # the readers inherit it (monkeypatch undoes it)
    root, limit = tmp_path / "cache", 3 * FILE_BYTES
    watcher = CacheWatcher(root)
    fork = multiprocessing.get_context("fork")
    readers = [fork.Process(target=_read_randomly, args=(url, str(root), limit, files, p, str(tmp_path / f"r{p}.json")))
               for p in range(PROCESSES)]
    try:
        for p in readers:
            p.start()
        deadline = time.monotonic() + DEADLINE_S
        for p in readers:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [p.pid for p in readers if p.is_alive()]
        for p in readers:
            p.kill() if p.is_alive() else None
    finally:
        watcher.stop()
        proxy.stop()
    assert not hung, f"readers {hung} waited for more than {DEADLINE_S} s"
    errors = [e for p in range(PROCESSES) for e in json.loads((tmp_path / f"r{p}.json").read_text())]
    assert errors == []
    assert proxy.counts["dropped"] > 0 and proxy.counts["forwarded"] > PROCESSES * THREADS
    assert watcher.peak <= limit + FILE_BYTES, f"the cache held {watcher.peak} bytes, limit {limit}"
    assert watcher.locks, "no lock file was ever seen"
    assert all(path.exists() and path.stat().st_ino == ino for path, ino in watcher.locks.items())


@pytest.fixture
def s3_wds(s3, packed_wds):
    url = s3.bucket("cached") + "/fixture.wds"
    upload_folder(packed_wds, url)
    return url


def _shard(ds, number: int = 0) -> dict:
    return ds.shard_entries()[number]


def test_two_hosts_sharing_a_folder_never_delete_each_others_downloads(s3_wds, tmp_path):
    ds = open_dataset(s3_wds)
    entry = _shard(ds)
    limit = 10 * entry["bytes"]
    node_a = ShardCache(RemoteStore(s3_wds), tmp_path / "shared", limit, host="node-a")
    node_b = ShardCache(RemoteStore(s3_wds), tmp_path / "shared", limit, host="node-b")
    copy = node_b.path(entry["name"], sha256=entry["sha256"])
    dead_here = 999_999_999  # node b's download: its PID is not alive on node a
    in_flight = copy.parent / f".{copy.name}~node-b~{dead_here}.part"
    in_flight.parent.mkdir(parents=True)
    in_flight.write_bytes(b"\0" * entry["bytes"])
    own_crash = copy.parent / f".{copy.name}~node-a~{dead_here}.part"  # node a's own dead download
    own_crash.write_bytes(b"\0" * 10)
    for other in ds.shard_entries()[1:3]:
        os.close(node_a.open(other["name"], size=other["bytes"], sha256=other["sha256"]))
    assert in_flight.exists() and not own_crash.exists()
    old = time.time() - STALE_PART_S - 60  # untouched for longer than a download can take: dead
    os.utime(in_flight, (old, old))
    os.close(node_a.open(entry["name"], size=entry["bytes"], sha256=entry["sha256"]))
    assert not in_flight.exists()


def test_a_dataset_converted_again_to_the_same_url_is_never_served_from_the_old_copy(s3_wds, packed_wds, tmp_path):
    old = open_dataset(s3_wds)
    first = old.shard_entries().first(1)  # the first record of shard 1
    before = old.record(first).data  # shard 1 is now cached
    again = tmp_path / "again.wds"
    shutil.copytree(packed_wds, again)
    shard = again / _shard(old, 1)["name"]
    blob = bytearray(shard.read_bytes())
    at = bytes(blob).index(before) + len(before) // 2
    blob[at] ^= 0xFF  # the same size, another image: only the digest tells them apart
    shard.write_bytes(bytes(blob))
    manifest = json.loads((again / "manifest.json").read_text())
    edit_shards(again, manifest, lambda shards: shards[1].update(sha256=hashlib.sha256(blob).hexdigest()))
    (again / "manifest.json").write_text(json.dumps(manifest))
    upload_folder(again, s3_wds)
    served = open_dataset(s3_wds).record(first).data
    assert served != before and served == open_dataset(again).record(first).data
    copies = [p for p in old.location.cache.folder.iterdir() if p.name.startswith(_shard(old, 1)["name"])]
    assert len(copies) == 2  # the old copy stays while `old` holds it open; later evictions take it


def test_a_file_open_in_a_reader_is_never_evicted_and_a_download_waits_for_room_then_fails(s3_wds, tmp_path):
    ds = open_dataset(s3_wds)
    a, b = ds.shard_entries()[:2]
    cache = ShardCache(RemoteStore(s3_wds), tmp_path / "c", max(a["bytes"], b["bytes"]) + 10, wait_s=0.5)
    held = cache.open(a["name"], size=a["bytes"], sha256=a["sha256"])
    with pytest.raises(CacheFull, match=r"cache_limit=[\d,]+ bytes has no room for train-000001.tar@\w+ "
                                        r"\([\d,]+ bytes\): [\d,]+ bytes are open in readers"):
        cache.open(b["name"], size=b["bytes"], sha256=b["sha256"])
    assert cache.path(a["name"], sha256=a["sha256"]).exists()
    os.close(held)  # the reader lets go: now it can be evicted
    os.close(cache.open(b["name"], size=b["bytes"], sha256=b["sha256"]))
    assert not cache.path(a["name"], sha256=a["sha256"]).exists()
    assert (cache.root / ".locks" / f"{cache.folder.name}-{a['name']}.lock").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 KiB filesystem (tmpfs), where mounting is allowed (root in a container that permits it);
    mode 0700, as a cache folder must be (a new tmpfs is 1777, which the cache refuses)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_a_store_error_naming_the_folder_and_the_space_needed(s3_wds, small_disk, caplog):
    loader = make_loader(s3_wds, cache_dir=small_disk, batch_size=4, image_size=16, device="cpu", num_workers=0)
    with pytest.raises(CacheFull, match=r"no space left in the cache folder .*small-disk.* needs [\d,]+ bytes, "
                                        r"the disk has [\d,]+ free") as error:
        for _ in loader:
            pass
    assert isinstance(error.value, StoreError) and not loader.skipped  # not a bad sample


def test_the_default_cache_is_node_local_and_a_network_filesystem_is_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / f"datapipe-{os.getuid()}"
    mounts = "/dev/vda / ext4 rw 0 0\nserver:/export/home /home nfs4 rw,relatime 0 0\n"
    assert filesystem_type(Path("/home/ada/.cache"), mounts) == "nfs4"
    assert filesystem_type(Path("/tmp/datapipe-0"), mounts) == "ext4"
    with caplog.at_level(logging.WARNING):
        assert warn_if_network(Path("/home/ada/.cache/datapipe"), mounts)
    assert "network filesystem (nfs4)" in caplog.text and "node-local" in caplog.text
    assert not warn_if_network(Path("/tmp/datapipe-0"), mounts)


def test_the_limit_must_hold_the_shards_a_ranks_workers_have_in_flight(s3_wds):
    """The fixture's train split has 4 shards: what workers, neighbours and read-ahead would hold (6 and
    more) is capped there, never past what the split has (shards_held's own test covers 96 shards)."""
    ds = open_dataset(s3_wds)
    entries = list(ds.shard_entries())
    biggest = max(s["bytes"] for s in entries)
    assert len(entries) == 4
    options = dict(batch_size=4, image_size=16, device="cpu", prefetch_factor=2)
    make_loader(s3_wds, cache_limit=4 * biggest, num_workers=4, **options)  # 32 samples in flight: all 4 shards
    with pytest.raises(ValueError, match=r"each holding 4 shards at once \(those its workers' batches in flight"):
        make_loader(s3_wds, cache_limit=3 * biggest, num_workers=1, **options)  # 8 in flight: 2 + 2 + 2, capped at 4
