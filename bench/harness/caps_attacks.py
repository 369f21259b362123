"""Attacks on the server-wide caps by one tenant, shared by tests/test_tenant_caps.py and
``python -m bench.abuse_caps``: a user who opens every stream it can, a member who holds
every upload it can, a follow of a queued job, an upload that trickles in, a project
that fills the code store. Real servers (real HTTP, SQLite, no Ray: jobs are put RUNNING
in the store)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import httpx

from bench.harness import download_attacks
from bench.harness.code_attacks import package
from bench.harness.jobstore import set_columns
from bench.harness.tenancy_world import World

MAX_STREAMS, MAX_UPLOADS, MAX_DOWNLOADS = 8, 4, 4  # shares at the defaults: a project half, a user a quarter
CAPS_ENV = {
    "RAYDOCK_MAX_STREAMS": str(MAX_STREAMS),
    "RAYDOCK_MAX_CONCURRENT_UPLOADS": str(MAX_UPLOADS),
    "RAYDOCK_MAX_CONCURRENT_DOWNLOADS": str(MAX_DOWNLOADS),
    "RAYDOCK_STREAM_IDLE_S": "2",
    "RAYDOCK_STREAM_RECHECK_S": "0.5",
    "RAYDOCK_UPLOAD_GRACE_S": "120",  # held uploads stay held while a test looks at them
}


def big_checkpoint(world: World, job_id: str) -> str:
    """A checkpoint of the job too big to sit in the sockets' buffers (32 MiB that do not
    compress): a download whose client reads nothing holds its place. Its download path."""
    row_id, _ = download_attacks.checkpoint(world, job_id, {"model.pt": os.urandom(32 * 2**20)})
    return download_attacks.download_path(job_id, row_id)


def running_job(world: World, project: str) -> str:
    job_id = world.fresh_job(project)
    set_columns(world.service, job_id, status="RUNNING", attempt=1)
    return job_id


@dataclass
class Opened:
    codes: list[int] = field(default_factory=list)
    shares: list[str] = field(default_factory=list)  # the `details[0].share` of each 429

    @property
    def served(self) -> int:
        return self.codes.count(200)


def open_follows(world: World, who: str, job_id: str, n: int, stack: ExitStack) -> Opened:
    """``n`` follows of the job's log by ``who``, each on its own connection, held open by ``stack``."""
    return open_answers(world, who, f"/v1/jobs/{job_id}/logs", {"follow": "true"}, n, stack)


def open_answers(world: World, who: str, path: str, params: dict, n: int, stack: ExitStack) -> Opened:
    """``n`` GETs of ``path`` by ``who`` whose answers are left unread past their head, each
    on its own connection, held open by ``stack``."""
    client = stack.enter_context(
        httpx.Client(base_url=world.url, headers=world.headers(who), timeout=30, limits=httpx.Limits(max_connections=n))
    )
    out = Opened()
    for _ in range(n):
        r = stack.enter_context(client.stream("GET", path, params=params))
        out.codes.append(r.status_code)
        if r.status_code == 429:
            details = json.loads(r.read())["error"].get("details") or [{}]
            out.shares.append(details[0].get("share", "server"))
    return out


def read_to_end(world: World, who: str, path: str, params: dict, timeout: float = 30.0) -> str:
    """The whole body of a stream; raises httpx.ReadTimeout when the stream does not end."""
    with httpx.Client(base_url=world.url, headers=world.headers(who), timeout=timeout) as client:
        with client.stream("GET", path, params=params) as r:
            assert r.status_code == 200, r.read()
            return r.read().decode()


def code_body(tag: str, size: int = 20_000) -> tuple[bytes, str]:
    body = package({"main.py": (f"# {tag}\n" + "x = 1\n" * (size // 6)).encode()})
    return body, hashlib.sha256(body).hexdigest()


def _incoming(world: World) -> int:
    incoming = world.server.data_dir / "code-incoming"
    return len(list(incoming.iterdir())) if incoming.exists() else 0


def _answered(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


@dataclass
class Held:
    socks: list[socket.socket]
    refused: list[bytes]  # each refusal's answer

    def release(self) -> None:
        for sock in self.socks:
            sock.close()


def hold_uploads(world: World, who: str, project: str, n: int) -> Held:
    """``n`` uploads by ``who`` that send half their body and wait: each one the server takes
    holds an upload place (its temp file appears); each one it refuses is answered at once."""
    port = world.server.port
    held = Held([], [])
    for i in range(n):
        body, sha = code_body(f"{who}-{i}-{time.monotonic_ns()}")
        head = (
            f"PUT /v1/code/{sha}?project={project} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {world.tokens[who]}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        before = _incoming(world)
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(head.encode() + body[: len(body) // 2])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _answered(sock):
                held.refused.append(sock.recv(65536))
                sock.close()
                break
            if _incoming(world) > before:
                held.socks.append(sock)
                break
            time.sleep(0.02)
    return held


def upload(world: World, who: str, project: str, body: bytes) -> httpx.Response:
    sha = hashlib.sha256(body).hexdigest()
    with world.http(who) as client:
        return client.put(f"/v1/code/{sha}", params={"project": project}, content=body)


def trickle_upload(url: str, body: bytes, chunk: int, every_s: float, wait_s: float) -> tuple[bytes, bool]:
    """An upload that sends ``chunk`` bytes every ``every_s``: the server's answer (b"" when
    none came within ``wait_s``), and whether the server closed the connection by then."""
    sha = hashlib.sha256(body).hexdigest()
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(f"PUT /v1/code/{sha} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode())

        def send() -> None:
            for start in range(0, len(body), chunk):
                if stop.wait(every_s):
                    return
                try:
                    sock.sendall(body[start : start + chunk])
                except OSError:
                    return

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        got, closed = b"", False
        try:
            while piece := sock.recv(65536):  # to the end of the answer: the server closes a cut upload
                got += piece
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
        finally:
            stop.set()
            sender.join(5)
        return got, closed
