"""A same-user process that takes over a node's warm socket path, for the attack test
(tests/test_warm_takeover.py) and its figures (bench/abuse_warm.py). No Ray cluster: the
warm process runs as the caller's child, so the caller stands where its supervisor
actor would.

The attacker unlinks the socket path and listens there, detached (its own session, its
parent gone) as a job's leftover would be, and records every byte and file descriptor
a client sends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainers.zygote.protocol import socket_path

REPO = Path(__file__).resolve().parents[2]

PLANT = r"""
import array, json, os, socket, sys
path, record = sys.argv[1], sys.argv[2]
if os.fork():
    os._exit(0)
os.setsid()
os.unlink(path)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(8)
got = {"connections": 0, "bytes": 0, "fds": 0}


def record_it():
    with open(record + ".tmp", "w") as f:
        json.dump(got, f)
    os.replace(record + ".tmp", record)


record_it()
print(os.getpid(), flush=True)
listener.settimeout(120)
while True:
    try:
        conn, _ = listener.accept()
    except socket.timeout:
        break
    got["connections"] += 1
    record_it()
    conn.settimeout(5)
    while True:
        fds = array.array("i")
        try:
            data, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(16 * fds.itemsize))
        except OSError:
            break
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got["fds"] += len(cdata) // fds.itemsize
        got["bytes"] += len(data)
        record_it()
        if not data:
            break
    conn.close()
"""


def start_warm(session: Path) -> tuple[str, subprocess.Popen, Path]:
    """A real warm process listening in ``session`` (laid out as a Ray session dir):
    (socket path, process, its stderr log)."""
    (session / "logs").mkdir(parents=True, exist_ok=True)
    path = socket_path(str(session))
    log = session / "warm.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainers.zygote.server", "--socket", path],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the warm process did not start listening: {log.read_text()}")
        time.sleep(0.1)
    return path, proc, log


def plant(path: str, record: Path) -> int:
    """Take the socket path over; the attacker's pid."""
    starter = subprocess.Popen([sys.executable, "-c", PLANT, path, str(record)], stdout=subprocess.PIPE, text=True)
    pid = int(starter.stdout.readline())  # printed once it listens and has written its record
    starter.wait(10)
    return pid


def planted_saw(record: Path) -> dict:
    """What the planted listener has been sent so far (it records each connection as it
    accepts it, and each message as it arrives)."""
    return json.loads(record.read_text())


def run_client(session: Path) -> tuple[int, str]:
    """A job's entrypoint on this node as Ray starts it (stdout: the job's driver log),
    with a secret in its environment; (exit code, what it logged)."""
    driver_log = session / "logs" / f"job-driver-raysubmit_{time.monotonic_ns()}.log"
    with open(driver_log, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "trainers.zygote.client", "train"],
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "RAYDOCK_SECRET": "s3cr3t"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    return done.returncode, driver_log.read_text()
