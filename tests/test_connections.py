"""The connection protocol (service/http/connections.py) on a real server process, over
raw sockets: what a client sends byte by byte and what comes back. Each deadline and cap
once, and the ordinary things a fast parser must still get right (keep-alive, pipelining,
a body in chunks)."""

from __future__ import annotations

import json
import socket

import pytest

from bench.harness import http_attacks
from bench.harness.specs import digits_spec

pytestmark = pytest.mark.slow  # a server process of its own

HEAD_LIMIT = 4096
GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = http_attacks.start_server(
        tmp_path_factory.mktemp("connections"),
        RAYDOCK_HEADER_TIMEOUT_S="1",
        RAYDOCK_BODY_TIMEOUT_S="1",
        RAYDOCK_MAX_HEADER_BYTES=str(HEAD_LIMIT),
    )
    yield s
    s.stop()


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_until_closed(s: socket.socket) -> bytes:
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """The (status, body) of each answer in ``raw`` (each with a Content-Length)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length")
        out.append((int(lines[0].split()[1]), rest[:length]))
        raw = rest[length:]
    return out


def read_answers(s: socket.socket, n: int) -> list[tuple[int, bytes]]:
    raw = b""
    while True:
        try:
            got = answers(raw)
        except (StopIteration, ValueError, IndexError):
            got = []
        if len(got) >= n and all(len(body) for _, body in got):
            return got
        chunk = s.recv(65536)
        assert chunk, f"closed after {raw!r}"
        raw += chunk


def test_a_head_past_the_cap_is_answered_431_and_closed(server):
    with connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for i in range(HEAD_LIMIT // 64 + 2):  # header lines that never end in a blank line
            s.sendall(b"X-Pad-%04d: " % i + b"a" * 50 + b"\r\n")
        got = read_until_closed(s)
    assert got.startswith(b"HTTP/1.1 431"), got[:80]
    assert json.loads(got.partition(b"\r\n\r\n")[2])["error"]["code"] == "headers_too_large"


def test_a_head_under_the_cap_is_served(server):
    with connect(server) as s:
        pad = b"X-Pad: " + b"a" * (HEAD_LIMIT - 200) + b"\r\n"
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + pad + b"\r\n")
        assert read_answers(s, 1)[0][0] == 200


def test_a_head_dribbled_a_byte_at_a_time_is_still_ended(server):
    # Each byte restarts no clock: the head's deadline (1 s) runs from the connection's start,
    # so the server ends the connection long before these 75 s of bytes are through.
    got, ended = b"", False
    with connect(server) as s:
        s.settimeout(0.05)
        for byte in http_attacks.HALF_HEAD * 30:
            try:
                s.sendall(bytes([byte]))
                chunk = s.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):  # closed between two bytes: the answer may be lost
                ended = True
                break
            got += chunk
            if not chunk:
                ended = True
                break
    assert ended
    assert got == b"" or got.startswith(b"HTTP/1.1 408"), got[:80]


def test_a_body_that_stops_arriving_is_closed(server):
    with connect(server) as s:
        s.sendall(http_attacks.HALF_BODY)
        got = read_until_closed(s)  # the server closes; the app never answers a body that never came
    assert not got.startswith(b"HTTP/1.1 2"), got[:80]


def test_a_body_in_slow_chunks_each_within_the_pause_bound_is_taken(server):
    body = json.dumps(digits_spec(name="chunked")).encode()
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with connect(server) as s:
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        step = len(body) // 4 + 1
        for start in range(0, len(body) - step, step):  # 0.4 s apart: 1.2 s in all, past the 1 s pause bound
            s.sendall(body[start : start + step])
            s.settimeout(0.4)
            with pytest.raises(TimeoutError):
                s.recv(1)  # neither answered nor closed while the body arrives
            s.settimeout(30)
        s.sendall(body[start + step :])
        status, answer = read_answers(s, 1)[0]
    assert status == 202, answer


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server):
    with connect(server) as s:
        for _ in range(3):  # one after another on one connection
            s.sendall(b"GET /v1/jobs/jmissing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, body = read_answers(s, 1)[0]
            assert status == 404 and json.loads(body)["error"]["code"] == "job_not_found"
        s.sendall(GET_HEALTHZ + b"GET /v1/jobs/jnone HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + GET_HEALTHZ)
        got = read_answers(s, 3)
    assert [status for status, _ in got] == [200, 404, 200]
    assert json.loads(got[1][1])["error"]["message"].count("jnone") >= 1
