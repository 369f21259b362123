"""The warm process on its own (no Ray cluster): one fresh fork per job, and nothing a
job changes in its process reaches the next job forked from the same warm process.

It starts ``python -m trainers.zygote.server`` on a socket in a temp dir laid out as a
Ray session dir, and speaks its protocol as the client does, with ``tests.support.zygote_probe``
as the driver. The warm process imports torch and ray.train: a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers.own_imports import ROOT
from trainers.zygote.protocol import LineReader, code_version, send_request, socket_path

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
PROBE = "tests.support.zygote_probe"


def start_warm(session: Path) -> subprocess.Popen:
    """A warm process listening in ``session`` (laid out as a Ray session dir)."""
    (session / "logs").mkdir()
    path = socket_path(str(session))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainers.zygote.server", "--socket", path, "--allow", PROBE],
        env=env,
        preexec_fn=lambda: os.nice(5),  # as Ray runs the warm process: at a worker's lower priority
        stdout=subprocess.DEVNULL,
        stderr=open(session / "warm.log", "wb"),
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert proc.poll() is None, (session / "warm.log").read_text()
        assert time.monotonic() < deadline, "the warm process did not start listening"
        time.sleep(0.1)
    return proc


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    session = tmp_path_factory.mktemp("session")
    proc = start_warm(session)
    yield session, proc
    proc.terminate()
    proc.wait(10)


def start(session: Path, argv: list[str], cwd: Path, env: dict[str, str] | None = None, python: str | None = None):
    """Ask for one job as the client would; (answer, reader, output file)."""
    out = session / "logs" / f"job-driver-{time.monotonic_ns()}.log"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(str(session)))
    with open(out, "wb") as f, open(os.devnull, "rb") as stdin:
        request = {
            "module": PROBE,
            "argv": argv,
            "cwd": str(cwd),
            "env": {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **(env or {})},
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "python": python or os.path.realpath(sys.executable),
            "prefix": sys.prefix,
            "root": ROOT,
            "code": code_version(ROOT),
        }
        send_request(sock, request, [stdin.fileno(), f.fileno(), f.fileno()])
    reader = LineReader(sock)
    return reader.next(), reader, out


def run(session: Path, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    answer, reader, out = start(session, argv, cwd, env)
    assert answer["accepted"], answer
    while (message := reader.next()) is not None and "exit" not in message:
        pass
    return message["exit"], out.read_text()


def seen(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


def test_a_job_leaves_nothing_the_next_job_on_the_same_warm_process_sees(warm, tmp_path):
    session, proc = warm
    a_dir, a_elsewhere, b_dir = tmp_path / "a", tmp_path / "a-moved", tmp_path / "b"
    for d in (a_dir, a_elsewhere, b_dir):
        d.mkdir()
    code_a, out_a = run(session, ["mark", str(a_elsewhere)], a_dir, {"OMP_NUM_THREADS": "2"})
    code_b, out_b = run(session, ["look"], b_dir, {"OMP_NUM_THREADS": "2", "RAYDOCK_PROBE_GIVEN": "b"})
    a, b = seen(out_a), seen(out_b)
    assert (code_a, code_b) == (0, 0), out_a + out_b
    # A changed its own process ...
    assert (a["global"], a["env"], a["cwd"], a["module_a"], a["torch_threads"]) == ("A", "A", str(a_elsewhere), True, 1)
    assert "probe-a" in a["threads"]
    # ... and B, forked from the same warm process, sees none of it.
    assert b["pid"] != a["pid"] and proc.poll() is None
    assert (b["global"], b["env"], b["module_a"]) == (None, None, False)
    assert b["given_env"] == "b" and b["argv"] == ["look"]
    assert b["cwd"] == str(b_dir) and b["files"] == [] and b["path0"] == str(b_dir)
    assert b["threads"] == ["MainThread"]  # nor a thread of the warm process's: a driver forks its ranks from one
    assert b["torch_threads"] == 2  # from B's own OMP_NUM_THREADS, not A's set_num_threads(1)
    assert a["random"] != b["random"]  # numpy's global RNG is reseeded per job, as in a new process
    assert not a["cuda"] and not b["cuda"]
    if os.geteuid() == 0:  # raising a priority back needs CAP_SYS_NICE
        assert b["nice"] == os.getpriority(os.PRIO_PROCESS, 0)  # the client's priority, not the warm process's
    assert not (b_dir / "left-by-a.txt").exists() and (a_elsewhere / "left-by-a.txt").exists()


def test_exit_codes_and_signals_come_back_as_the_driver_ended(warm, tmp_path):
    session, _ = warm
    code, _ = run(session, ["exit", "3"], tmp_path)
    assert code == 3
    answer, reader, out = start(session, ["hang"], tmp_path)
    assert answer["accepted"]
    deadline = time.monotonic() + 30
    while "hanging" not in out.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(answer["pid"], signal.SIGTERM)  # what the client relays when Ray stops the job
    while (message := reader.next()) is not None and "exit" not in message:
        pass
    assert message == {"exit": -signal.SIGTERM}


def test_a_client_that_is_killed_takes_its_driver_with_it(warm, tmp_path):
    """Ray SIGKILLs an entrypoint that outlives its stop grace period; that cannot be
    relayed, so the driver notices its client is gone and ends its process group."""
    session, _ = warm
    answer, reader, out = start(session, ["hang"], tmp_path)
    pid = answer["pid"]
    deadline = time.monotonic() + 30
    while "hanging" not in out.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    reader.sock.close()
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the driver outlived its client"
        time.sleep(0.05)


def test_a_driver_ends_with_its_client_when_its_warm_process_is_gone(tmp_path_factory, tmp_path):
    """A warm process that left (its actor gone, its path taken) no longer watches its
    drivers' clients; the kernel still ends a driver whose client hangs up."""
    session = tmp_path_factory.mktemp("session")
    proc = start_warm(session)
    try:
        answer, reader, out = start(session, ["hang"], tmp_path)
        pid = answer["pid"]
        _wait_for_output(out, "hanging")
    finally:
        proc.kill()
        proc.wait(10)
    assert _alive(pid)  # a running driver goes on when its warm process leaves
    reader.sock.close()
    if not _gone_within(pid, 10):
        os.killpg(pid, signal.SIGKILL)
        pytest.fail("the driver outlived its client once its warm process was gone")


def _wait_for_output(out: Path, text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in out.read_text():
        assert time.monotonic() < deadline, f"{text!r} never came"
        time.sleep(0.05)


def test_another_python_or_other_code_is_refused_before_anything_runs(warm, tmp_path):
    session, _ = warm
    answer, _, out = start(session, ["look"], tmp_path, python="/usr/bin/python3-elsewhere")
    assert answer["accepted"] is False and "another Python" in answer["reason"]
    assert out.read_text() == ""


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` ended (or is a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_warm_process_whose_supervisor_dies_during_its_imports_leaves(tmp_path):
    """The supervisor is the one before the seconds of imports: if it dies in them, the
    warm process sees it gone once it would serve, and leaves (no orphan on the node)."""
    session = tmp_path / "session"
    (session / "logs").mkdir(parents=True)
    spawn = (
        "import os, subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-m', 'trainers.zygote.server', '--socket', {socket_path(str(session))!r}, "
        "'--parent', str(os.getpid())], "
        f"stdout=open({str(tmp_path / 'warm.out')!r}, 'wb'), stderr=subprocess.STDOUT); print(p.pid)"
    )
    # The supervisor starts the warm process and exits at once, in the middle of its imports.
    done = subprocess.run(
        [sys.executable, "-c", spawn], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    pid = int(done.stdout)
    if not _gone_within(pid, 120):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the warm process outlived its supervisor, which died during its imports")
    assert "imported torch" in (tmp_path / "warm.out").read_text()  # it left after its imports, not at its start
