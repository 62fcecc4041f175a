"""Real local object stores for the tests, on loopback only: moto's S3 server and an HTTP server
that answers Range requests (what obstore's HTTP store sends)."""
from __future__ import annotations

import http.server
import os
import re
import socket
import threading
import urllib.request
import weakref
from pathlib import Path

import pytest

# The servers run in the test process, and everything it forks (the store helpers, DataLoader and reader
# workers) would inherit their listening sockets: a stopped server's port would still take connections
# into a backlog nobody accepts, and a request made in such a child hangs for its read timeout, three
# times over the retry budget (~65 s), instead of being refused like a request to a server that is gone.
_LISTENING: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def _close_listening_in_child() -> None:
    for sock in list(_LISTENING):
        sock.close()


os.register_at_fork(after_in_child=_close_listening_in_child)


POLL_S = 0.02  # how soon serve_forever sees a shutdown: socketserver's 0.5 s default was every test's teardown


def serve(server):
    """Serve a socketserver-style server in a daemon thread; its listening socket is closed in
    every child forked from here."""
    _LISTENING.add(server.socket)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True).start()
    return server


def stop_serving(server) -> None:
    """Shut the server down and close its socket: new connections are refused."""
    server.shutdown()
    server.server_close()


class S3Server:
    """moto's S3 server (the app and handler its ThreadedMotoServer runs) on 127.0.0.1, port 0; the
    AWS_* variables point at it."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        self.server = serve(make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app),
                                        threaded=True, request_handler=MotoRequestHandler))
        host, port = self.server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"

    def bucket(self, name: str) -> str:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")).close()
        return f"s3://{name}"

    def stop(self) -> None:
        """Shut the server down and close its socket: new connections are refused."""
        stop_serving(self.server)


def isolated_cache(monkeypatch, tmp_path) -> None:
    """The default shard cache ($TMPDIR/datapipe-UID) in this test's own folder, for its children too."""
    folder = tmp_path / "tmpdir"
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(folder))


@pytest.fixture
def s3(monkeypatch, tmp_path):
    server = S3Server()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-printed")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    isolated_cache(monkeypatch, tmp_path)
    yield server
    server.stop()


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range GETs (206 + Content-Range), as object stores serve them."""

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if not match or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
        fh = open(path, "rb")
        fh.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        self.end_headers()
        self.range_left = end - start + 1
        return fh

    def copyfile(self, source, outputfile):
        left = getattr(self, "range_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(left))


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """(folder served, base URL) of a Range-capable HTTP server on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: RangeHandler(*a, directory=str(root), **k)  # noqa: E731
    server = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))
    isolated_cache(monkeypatch, tmp_path)
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    stop_serving(server)


def upload_folder(folder: Path, url: str) -> None:
    """Put every file of a local dataset folder under `url` (manifest last, as `convert` does)."""
    from datapipe.storage import RemoteStore

    store = RemoteStore(url)
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    for p in sorted(files, key=lambda p: p.name == "manifest.json"):
        store.upload(p.name, p)


@pytest.fixture
def s3_wds(s3, packed_wds):
    """The fixture .wds uploaded to moto's S3 (its URL)."""
    url = s3.bucket("data") + "/fixture.wds"
    upload_folder(packed_wds, url)
    return url
