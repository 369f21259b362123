"""The warm-start pieces that need no process of their own: the socket protocol (a
request and its file descriptors in, malformed ones refused), where the socket lives,
the code version, the environment a cold driver starts the pool with, and that the warm
process's imports leave a search's driver nothing to import as Tune sets the search up."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.zygote import pool
from trainers.zygote.protocol import MAX_REQUEST_BYTES, LineReader, code_version, recv_request, send_line, send_request

REPO = Path(__file__).resolve().parents[1]


def test_a_request_travels_with_its_three_descriptors(tmp_path):
    a, b = socket.socketpair()
    files = [open(tmp_path / n, "w+") for n in ("in", "out", "err")]
    request = {"module": "trainers.driver", "env": {"BIG": "x" * 200_000}, "argv": ["a"]}
    send_request(a, request, [f.fileno() for f in files])
    got, fds = recv_request(b)
    assert got == request and len(fds) == 3
    os.write(fds[1], b"through the passed descriptor")
    files[1].seek(0)
    assert files[1].read() == "through the passed descriptor"
    for fd in fds:
        os.close(fd)
    send_line(a, {"accepted": True, "pid": 7})
    send_line(a, {"exit": 3})
    a.close()
    reader = LineReader(b)
    assert [reader.next(), reader.next(), reader.next()] == [{"accepted": True, "pid": 7}, {"exit": 3}, None]


@pytest.mark.parametrize(
    "data, fds, why",
    [
        (struct.pack("!I", MAX_REQUEST_BYTES + 1), 3, "request of"),
        (struct.pack("!I", 2) + b"[]", 3, "file descriptors"),
        (struct.pack("!I", 2) + b"{}", 1, "file descriptors"),
        (b"\x00", 3, "short"),
        (struct.pack("!I", 100) + b"{", 3, "cut short"),
    ],
)
def test_a_malformed_request_is_refused_and_its_descriptors_closed(data, fds, why):
    a, b = socket.socketpair()
    r, w = os.pipe()
    a.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{fds}i", *[w] * fds))])
    a.shutdown(socket.SHUT_WR)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError) as err:
        recv_request(b)
    assert why in str(err.value)
    # What came with it is closed: no descriptor is open now that was not before (a count
    # would also see descriptors of earlier tests that the collector closes meanwhile).
    assert set(os.listdir("/proc/self/fd")) - before == set()
    os.close(w)
    assert select.select([r], [], [], 30)[0], "a copy of the pipe's write end is still open"
    assert os.read(r, 1) == b""  # no copy of the write end is left open


def test_the_code_version_changes_with_the_code(tmp_path):
    (tmp_path / "trainers").mkdir()
    module = tmp_path / "trainers" / "loop.py"
    module.write_text("x = 1\n")
    first = code_version(str(tmp_path))
    assert code_version(str(tmp_path)) == first
    module.write_text("x = 22\n")
    assert code_version(str(tmp_path)) != first


def test_the_pool_starts_without_the_jobs_own_environment(monkeypatch):
    job = {"runtime_env": {"env_vars": {"MY_SECRET": "s", "RAYDOCK_LAUNCH_URI": "file:///x"}, "working_dir": "w"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    monkeypatch.setenv("MY_SECRET", "s")
    monkeypatch.setenv("RAYDOCK_LAUNCH_URI", "file:///x")
    monkeypatch.setenv("RAYDOCK_WARM_IDLE_S", "42")
    monkeypatch.setenv("PYTHONPATH", "/tmp/ray/session_1/runtime_resources/working_dir_files/abc:/opt/raydock")
    env = pool.clean_env()
    assert "MY_SECRET" not in env and "RAYDOCK_LAUNCH_URI" not in env and "RAY_JOB_CONFIG_JSON_ENV_VAR" not in env
    assert env["PYTHONPATH"] == "/opt/raydock" and env["RAYDOCK_WARM_IDLE_S"] == "42.0"


def test_a_job_in_its_own_environment_does_not_start_the_pool(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"pip": ["x"]}}))
    monkeypatch.setenv(pool.START_ENV, str(tmp_path / "raydock" / "zygote.sock"))
    assert pool.start_if_asked() is False
    assert not (tmp_path / "raydock").exists()


# After the warm process's imports, what Tune's set-up of a search imports in the driver
# forked from it: the modules it imports that were not there yet, by top-level package.
TUNE_SET_UP = """
import sys
from trainers.zygote import server
server.preload()
before = set(sys.modules)
from ray import tune
from ray.air._internal.usage import _count_callbacks
from ray.tune.utils.callback import _create_default_callbacks
_count_callbacks([tune.Callback()])  # Tune's usage tag of a run's callbacks
_create_default_callbacks([tune.Callback()])  # its default loggers
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def test_a_search_driver_forked_warm_imports_nothing_as_tune_sets_up():
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + TUNE_SET_UP],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], out.stdout
