"""Attacks on the HTTP server itself, as any client that can reach its port could make
them, against a real server process (real sockets, no Ray: nothing here needs a job).
Shared by tests/test_http_abuse.py and ``python -m bench.abuse_http``, which print the
same figures."""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess

HALF_HEAD = b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # the blank line never comes
HALF_BODY = (
    b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
)


def start_server(data_dir: Path, *, nofile: int | None = None, **env: str) -> ServerProcess:
    return ServerProcess(data_dir, dead_ray(), nofile=nofile, extra_env=env).start()


def half_sent(server: ServerProcess, n: int, stack: ExitStack) -> list[socket.socket]:
    """``n`` connections, each with half a request sent (a head without its end, or a
    head and one byte of its body), held open by ``stack``."""
    socks = []
    for i in range(n):
        s = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        s.sendall(HALF_BODY if i % 2 else HALF_HEAD)
        socks.append(s)
    return socks


def healthz_s(server: ServerProcess, timeout: float) -> float:
    """Seconds /healthz takes to answer 200 on a new connection; ``timeout`` when it does not."""
    start = time.monotonic()
    try:
        r = httpx.get(server.url + "/healthz", timeout=timeout)
    except httpx.HTTPError:
        return timeout
    return time.monotonic() - start if r.status_code == 200 else timeout


@dataclass
class Slowloris:
    connections: int
    healthz_s: float  # /healthz while the half-sent connections are open
    server_fds: int  # descriptors the server holds then
    healthz_answered: bool  # 200 before ``healthz_timeout``


def slowloris(server: ServerProcess, connections: int, healthz_timeout: float = 10.0) -> Slowloris:
    with ExitStack() as stack:
        half_sent(server, connections, stack)
        took = healthz_s(server, healthz_timeout)
        return Slowloris(connections, took, server.open_fds(), took < healthz_timeout)


def head_timeout(server: ServerProcess, wait: float) -> tuple[float, bytes]:
    """One connection that sends half a request head and waits: how long until the
    server answers or closes it (``wait`` when it does neither), and what it sent."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as s:
        s.sendall(HALF_HEAD)
        start, got = time.monotonic(), b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except TimeoutError:
            return wait, got
        return time.monotonic() - start, got


def own_address() -> str | None:
    """An address of this machine other than loopback (the source of a route outward), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outward interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def start_on_every_interface(data_dir: Path, **env: str) -> ServerProcess:
    """The app as uvicorn serves it when started by hand on 0.0.0.0: its settings still say 127.0.0.1."""
    server = ServerProcess(data_dir, dead_ray(), extra_env=env)
    server.argv = [
        "-m",
        "uvicorn",
        "--factory",
        "service.http.app:create_app",
        "--host",
        "0.0.0.0",
        "--port",
        str(server.port),
    ]
    return server.start()


def unauthenticated_post_answer(server: ServerProcess, wait: float) -> tuple[float, bytes]:
    """A POST without the token whose body is announced and never sent: how long the
    server takes to answer (``wait`` when it waits for the body instead), and the answer."""
    head = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 500000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as s:
        s.sendall(head)
        start = time.monotonic()
        try:
            got = s.recv(4096)
        except TimeoutError:
            return wait, b""
        return time.monotonic() - start, got


def hung_dashboard(stack: ExitStack) -> str:
    """A Ray dashboard address that takes connections and never answers (a hung head)."""
    listener = stack.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)  # connections wait in the backlog: never accepted, never answered
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def bulk_cancel_s(server_url: str, ids: list[str], timeout: float) -> tuple[float, httpx.Response | None]:
    start = time.monotonic()
    try:
        r = httpx.post(f"{server_url}/v1/jobs:cancel", json={"ids": ids}, timeout=timeout)
    except httpx.TimeoutException:
        return timeout, None
    return time.monotonic() - start, r
