"""Real local object stores for the tests, on loopback only: moto's S3 server and an HTTP server
that answers Range requests (what obstore's HTTP store sends)."""
from __future__ import annotations

import http.server
import re
import threading
import urllib.request
from pathlib import Path

import pytest


class S3Server:
    """moto's ThreadedMotoServer on 127.0.0.1, port 0; the AWS_* variables point at it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def bucket(self, name: str) -> str:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")).close()
        return f"s3://{name}"

    def stop(self) -> None:
        """Shut the server down and close its socket: new connections are refused."""
        self.server.stop()
        if self.server._server is not None:
            self.server._server.server_close()


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
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    isolated_cache(monkeypatch, tmp_path)
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def upload_folder(folder: Path, url: str) -> None:
    """Put every file of a local dataset folder under `url` (manifest last, as `convert` does)."""
    from datapipe.storage import RemoteStore

    store = RemoteStore(url)
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    for p in sorted(files, key=lambda p: p.name == "manifest.json"):
        store.upload(p.name, p)
