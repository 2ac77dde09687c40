"""A real HTTP server on 127.0.0.1 that serves saved pages and injects the faults crawlers meet.

    web.route("/q/1", body)                                  # always this body
    web.script("/q/2", Reply(429, headers={"Retry-After": "1"}), Reply(200, body))  # in order, last repeats
    web.url("/q/1"); web.requests (paths served); web.log (time, path, headers of every request)

A `Reply` can be slow (`delay`), reset the connection (`reset=True`), or promise more bytes than it sends
(`truncate=True`). Files served with `ranges=True` honour `Range: bytes=N-` (206), as download mirrors do.
"""

from __future__ import annotations

import http.server
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    reset: bool = False
    truncate: bool = False
    ranges: bool = False


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        server = self.server
        with server.lock:
            server.log.append((time.time(), self.path, dict(self.headers)))
            replies = server.scripts.get(self.path)
            base, _, query = self.path.partition("?")
            if replies is None:
                replies = server.scripts.get(base + "?*")
            if replies is None and base in server.handlers:
                replies = [server.handlers[base](dict(parse_qsl(query, keep_blank_values=True)))]
            if replies is None:
                reply = Reply(404, b"not found")
            else:
                reply = replies.pop(0) if len(replies) > 1 else replies[0]
        if reply.delay:
            time.sleep(reply.delay)
        if reply.reset:
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.request.close()
            return
        body, status = reply.body, reply.status
        headers = {"Content-Type": "text/html; charset=utf-8", **reply.headers}
        if reply.ranges:
            headers["Accept-Ranges"] = "bytes"
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes=") and wanted.endswith("-"):
                start = int(wanted[len("bytes=") : -1])
                headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
                body, status = body[start:], 206
        if not reply.truncate:
            # Recorded before the body goes out: a client that has read its response must see it here.
            with server.lock:
                server.requests.append(self.path)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        if reply.truncate:
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body[: len(body) // 2] if reply.truncate else body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if reply.truncate:
            self.close_connection = True

    def log_message(self, *args):
        pass


class FakeWeb:
    def __init__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.lock = threading.Lock()
        self.server.scripts, self.server.log, self.server.requests = {}, [], []
        self.server.handlers = {}
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def route(self, path: str, body, status: int = 200, headers: dict | None = None, **kw) -> None:
        """Serve `body` at `path` (exact, query included; `path?*` matches any query)."""
        body = body.encode() if isinstance(body, str) else body
        self.script(path, Reply(status, body, headers or {}, **kw))

    def handle(self, path: str, handler) -> None:
        """Answer `path` (any query) with `handler(query: dict) -> Reply`; scripted paths take precedence."""
        self.server.handlers[path] = handler

    def script(self, path: str, *replies: Reply) -> None:
        with self.server.lock:
            self.server.scripts[path] = list(replies)

    @property
    def requests(self) -> list[str]:
        return list(self.server.requests)

    @property
    def log(self) -> list[tuple]:
        return list(self.server.log)

    def hits(self, path: str) -> int:
        return sum(1 for _, p, _ in self.log if p == path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def assert_paced(stamps: list[float], rate: float) -> None:
    """Assert that requests stamped at `stamps` kept one budget of `rate` per second.

    A limiter hands out slots exactly `1/rate` apart, but a request leaves and is stamped some time after its
    slot: on a loaded 2-core machine that lateness reaches 0.1 s (measured), so two neighbours can arrive much
    closer than `1/rate` though neither broke the budget. What lateness under one period cannot do: put three
    requests in one period (a late one can meet only the next, on time), or shorten the whole run by more than
    a period. A budget per process instead of one shared (N processes at `rate` each) puts N in every period.
    """
    stamps = sorted(stamps)
    period = 1.0 / rate
    span = stamps[-1] - stamps[0]
    assert span >= (len(stamps) - 2) * period, (
        f"{len(stamps)} requests in {span:.2f} s: at {rate:g}/s they need at least {(len(stamps) - 1) * period:.2f} s"
    )
    crowded = max(sum(1 for t in stamps[i:] if t < start + period) for i, start in enumerate(stamps))
    assert crowded <= 2, f"{crowded} requests within one period ({period:.2f} s) at {rate:g}/s: {stamps}"
