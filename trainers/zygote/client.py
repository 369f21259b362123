"""The Ray job entrypoint of a raydock job: ``python -m trainers.zygote.client train|tune``.

Standard library only, so it starts in tens of milliseconds (ray's GCS client is imported
once a socket answers, to check who answers: ``trainers.zygote.peer``). It asks the node's warm
process (``trainers.zygote.server``) to fork a driver for it with this process's stdin,
stdout, stderr, cwd and environment, relays the stop signals Ray sends it (SIGINT or
SIGTERM) to that driver's process group, and exits as the driver did.

It runs the cold driver instead (``os.execv`` of ``python -m trainers.driver``, as the
entrypoint was before) whenever the warm process cannot serve this job exactly as that
would: no socket (the first job on a node, or warm starts off), a refused or broken
connection, another Python (a runtime_env pip/uv job runs in its own virtualenv), or
other raydock code than the warm process imported, or a peer that is not the node's warm
process (it is then sent nothing at all). Nothing has run before that choice,
so a job runs once either way.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from api.cluster_contract import WARM_START_ENV
from trainers.own_imports import ROOT
from trainers.zygote import peer
from trainers.zygote.protocol import (
    DRIVERS,
    START_ENV,
    LineReader,
    code_version,
    send_request,
    session_dir,
    socket_path,
)

CONNECT_TIMEOUT_S = 2.0
ACCEPT_TIMEOUT_S = 30.0  # the warm process answers at once; a hung one must not hold the job
WARM_ENV = WARM_START_ENV  # "0"/"false" in a job's environment: always cold


def warm_starts_off() -> bool:
    """Whether this job's environment turned warm starts off (the server's setting, or the job's own ``env_vars``)."""
    return os.environ.get(WARM_ENV, "1").lower() in ("0", "false", "no", "off")


def cold(module: str, args: list[str]) -> None:
    """Become the cold driver, as the entrypoint was before warm starts."""
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def warm(module: str, args: list[str]) -> int | None:
    """Run the driver in a child of the node's warm process; its exit code, or None
    when the warm process did not take the job (nothing ran)."""
    if warm_starts_off():
        return None
    session = session_dir()
    if session is None:
        return None
    if not os.path.exists(path := socket_path(session)):
        os.environ[START_ENV] = path  # the cold driver starts this node's pool for the next job
        return None
    supervisors, unknown = peer.pool_actors()
    if unknown:
        print(f"raydock: cannot check who answers on {path} ({unknown}); starting cold", file=sys.stderr)
        return None
    asked = ask(path, supervisors, module, args, [0, 1, 2])
    if isinstance(asked, str):
        print(f"raydock: {asked}; starting cold", file=sys.stderr)
        return None
    reader, pid = asked
    return _follow(reader, pid)


def ask(path: str, supervisors: set[int], module: str, args: list[str], fds: list[int]) -> tuple[LineReader, int] | str:
    """Ask the warm process at ``path`` (checked against the pool's ``supervisors``) to fork
    a child running ``module`` with ``fds`` as its stdin, stdout and stderr and this
    process's cwd and environment: the reader of its answers and the child's pid, or why
    not (nothing ran then). The child lives while the returned reader's socket is open."""
    request = {
        "module": module,
        "argv": args,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "python": os.path.realpath(sys.executable),
        "prefix": sys.prefix,
        "root": ROOT,
        "code": code_version(ROOT),
    }
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
        if reason := peer.distrust(sock, path, supervisors):
            sock.close()
            return f"{path} is not this node's warm process ({reason})"
        sock.settimeout(ACCEPT_TIMEOUT_S)
        try:
            send_request(sock, request, fds)
        except BrokenPipeError:
            pass  # refused before it read all of it: its answer says why
        reader = LineReader(sock)
        answer = reader.next()
    except (OSError, ValueError) as exc:
        sock.close()
        return f"warm start unavailable ({type(exc).__name__}: {exc})"
    if not answer or not answer.get("accepted"):
        sock.close()
        return f"warm start refused ({(answer or {}).get('reason', 'no answer')})"
    sock.settimeout(None)
    return reader, int(answer["pid"])


def _follow(reader: LineReader, pid: int) -> int:
    """Relay stop signals to the driver's process group until its exit code comes."""
    done = False

    def relay(signum, _frame):
        if not done:
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, relay)
    try:
        while (message := reader.next()) is not None:
            if "exit" in message:
                done = True
                return int(message["exit"])
    except (OSError, ValueError):
        pass
    done = True
    print("raydock: the warm driver ended without an exit status", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in DRIVERS:
        print(f"usage: python -m trainers.zygote.client {'|'.join(DRIVERS)} [args]", file=sys.stderr)
        return 2
    module, args = DRIVERS[argv[0]], argv[1:]
    code = warm(module, args)
    if code is None:
        cold(module, args)
    if code < 0:  # killed by a signal: end the same way, so Ray sees what the cold driver would show
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
