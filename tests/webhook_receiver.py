"""A real HTTP server in the test process that takes webhook posts on loopback: it keeps
every post (path, headers, body) and answers each path with the statuses it is told
(then 200), optionally after a delay."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.perf_counter() when it arrived

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Receiver:
    def __init__(self) -> None:
        self.posts: list[Received] = []
        self.answers: dict[str, list[int]] = {}  # path -> statuses to answer first, in order
        self.delays: dict[str, list[float]] = {}  # path -> seconds to wait before those answers
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.posts.append(Received(self.path, dict(self.headers), body, time.perf_counter()))
                    status = (outer.answers.get(self.path) or [200]).pop(0) if outer.answers.get(self.path) else 200
                    delay = outer.delays[self.path].pop(0) if outer.delays.get(self.path) else 0.0
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def wait_for(self, path: str, predicate, timeout: float = 60.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.at(path)
            if predicate(got):
                return got
            time.sleep(0.1)
        raise AssertionError(f"{path}: {[p.event for p in self.at(path)]}")
