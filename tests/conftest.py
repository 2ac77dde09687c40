"""Shared fixtures: the real data in ../shared/data, one local Ray per session, a loopback HTTP server."""
from __future__ import annotations

import http.server
import logging
import os
import threading

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("QA_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))


@pytest.fixture(scope="session")
def shared_data() -> str:
    """`../shared/data` beside the clone (or $QA_SHARED_DATA); tests that need it skip where it is absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"real data not found at {SHARED_DATA} (clone next to shared/ or set QA_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def beer_dump(shared_data) -> str:
    path = os.path.join(shared_data, "stackexchange_dump_beer", "Posts.xml.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance, started once per test session and shut down at its end."""
    import ray
    from ray.data import DataContext

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's naming)
        route = self.server.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        status, headers, body = route
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.requests.append(self.path)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1 (never the internet): `server.route(path, body, status, headers)`,
    `server.url(path)`, `server.requests` (paths served)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.routes, server.requests = {}, []
    server.route = lambda path, body, status=200, headers=None: server.routes.__setitem__(
        path, (status, headers or {"Content-Type": "text/html; charset=utf-8"}, body))
    server.url = lambda path: f"http://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
