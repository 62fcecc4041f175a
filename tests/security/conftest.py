"""Loopback servers for the security tests: moto's S3 and a Range-capable HTTP server (tests/storage),
and an HTTP server that answers every request with one fixed error status and body."""
from __future__ import annotations

import http.server

import pytest

from tests.processes import deadline
from tests.storage.conftest import http_root, isolated_cache, s3, serve, stop_serving, upload_folder  # noqa: F401


class FixedAnswer(http.server.BaseHTTPRequestHandler):
    """Every GET and HEAD answered with the server's `status` and `body`."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        body = self.server.body.encode()
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET


@pytest.fixture
def failing_http(tmp_path, monkeypatch):
    """A function (status, body) -> base URL of a server on 127.0.0.1 that answers so."""
    servers = []

    def start(status: int, body: str = "") -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FixedAnswer)
        server.status, server.body = status, body
        servers.append(serve(server))
        return f"127.0.0.1:{server.server_address[1]}"

    isolated_cache(monkeypatch, tmp_path)
    yield start
    for server in servers:
        stop_serving(server)


@pytest.fixture(autouse=True)
def _deadline():
    """Each test (its forked store helpers included) ends within 120 s, or fails instead of hanging."""
    with deadline(120):
        yield
