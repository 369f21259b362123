"""What a child forked by the warm process does to become a job's driver, started as
``python -m <driver>`` would have been from the Ray job's entrypoint: its own session
(so a stop reaches its whole process group), the client's stdin/stdout/stderr, cwd,
environment and import path, Python's default signal handling, then the driver module
run as ``__main__``. Its exit code goes back on the client's connection.

What the warm process set up once and each child keeps: the imported modules (torch,
ray.train, raydock's drivers) and nothing else: no Ray connection, no CUDA, no threads.
What a fork would share by accident is reset here: numpy's global random state (seeded
once at import), torch's intra-op thread count (the OpenMP default was read from the warm
process's environment), and Ray settings read when ``ray`` was imported.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import importlib.util
import io
import os
import runpy
import signal
import socket
import sys
import traceback
from typing import NoReturn

from api.cluster_contract import RANK_HOST_MODULE
from trainers.zygote.protocol import send_line

DEFAULT_HANDLERS = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGQUIT: signal.SIG_DFL,
    signal.SIGCHLD: signal.SIG_DFL,
    signal.SIGPIPE: signal.SIG_IGN,  # as Python starts
}


def become_driver(
    request: dict, fds: list[int], conn: socket.socket, inherited: list[int], base_path: list[str]
) -> NoReturn:
    """Run the job's driver in this freshly forked child and exit with its code."""
    code = 1
    try:
        _take_process(request, fds, inherited, base_path)
        _end_with_client(conn)
        if request["module"] != RANK_HOST_MODULE:  # a trial's rank host: its trainable says so
            print(f"raydock: warm start, driver {os.getpid()} forked from warm process {os.getppid()}", file=sys.stderr)
        code = _run(request["module"], request.get("argv") or [])
    except BaseException:  # noqa: BLE001 - whatever happens, the client hears an exit code
        traceback.print_exc()
    _exit(conn, code)


def _take_process(request: dict, fds: list[int], inherited: list[int], base_path: list[str]) -> None:
    os.setsid()
    for fd in inherited:  # the warm process's listening socket and signal pipe
        os.close(fd)
    signal.set_wakeup_fd(-1)
    for signum, handler in DEFAULT_HANDLERS.items():
        signal.signal(signum, handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _take_priority(request.get("nice"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # python -m puts the working directory first, then PYTHONPATH, then the install's own path.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in base_path if p not in extra]]
    importlib.invalidate_caches()
    _reopen_stdio()
    _reset_shared_state()


def _end_with_client(conn: socket.socket) -> None:
    """The kernel ends this driver's process group (its ranks too) when the client hangs
    up: the connection signals SIGIO to the group, whose default action ends a process.
    The warm process also watches the client and kills the group, but a warm process that
    left (its actor gone, its path taken, stopped) leaves its running drivers behind, and
    Ray's stop, which SIGKILLs the client after its grace period, reaches no further.
    The client sends nothing after its request, so any SIGIO is its hangup."""
    fd = conn.fileno()
    signal.signal(signal.SIGIO, signal.SIG_DFL)
    fcntl.fcntl(fd, fcntl.F_SETOWN, -os.getpgrp())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    try:  # gone before the watch was set: no signal will come
        gone = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        gone = False
    except OSError:
        gone = True
    if gone:
        os.killpg(0, signal.SIGKILL)


def _take_priority(nice: object) -> None:
    """The client's priority: the warm process runs at a Ray worker's (nice 15, so its
    imports never slow a job down); the driver, and the ranks it may fork, run as the
    entrypoint would. Raising priority needs CAP_SYS_NICE; without it the driver stays
    at the warm process's and says so."""
    if not isinstance(nice, int) or nice == os.getpriority(os.PRIO_PROCESS, 0):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        print(f"raydock: the warm driver keeps nice {os.getpriority(os.PRIO_PROCESS, 0)} ({exc})", file=sys.stderr)


def _reopen_stdio() -> None:
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False), errors="strict")
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = io.open(fd, "wb", buffering=0, closefd=False)
        stream = raw if unbuffered else io.BufferedWriter(raw)
        text = io.TextIOWrapper(stream, line_buffering=True, write_through=unbuffered, errors="backslashreplace")
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)
    sys.__stdin__ = sys.stdin


def _reset_shared_state() -> None:
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # fresh entropy, as a new process would draw
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        threads = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else max(1, os.cpu_count() or 1))
    from trainers.ray_compat import reread_import_time_settings

    reread_import_time_settings()


def _run(module: str, argv: list[str]) -> int:
    spec = importlib.util.find_spec(module)
    sys.argv = [spec.origin if spec and spec.origin else module, *argv]
    # As under python -m, the driver runs as __main__ only (the warm process imported it under its name).
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 128 + signal.SIGINT
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _exit(conn: socket.socket, code: int) -> NoReturn:
    try:
        atexit._run_exitfuncs()  # ray.shutdown and the rest, as at a normal interpreter exit
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        send_line(conn, {"exit": code})
    except OSError:
        pass
    os._exit(code)
