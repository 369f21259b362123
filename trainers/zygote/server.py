"""The warm process of a node: ``python -m trainers.zygote.server --socket PATH``.

It imports once what every driver imports (torch, ray.train, ray.train.torch, raydock's
drivers: about 4.5 s on 2 cores), then listens on the node's unix socket
(``trainers.zygote.protocol``) and forks one fresh child per job to be that job's driver
(``trainers.zygote.child``), or per search trial's trainable to be the rank host that
forks the trial's local ranks (``trainers.zygote.rank_host``). Jobs never share a process: what one job changes (globals,
environment, working directory, threads, CUDA) ends with its child.

Forking is safe only from a single-threaded process with no CUDA context, so this
process starts no thread and never touches CUDA, and checks both before each fork; it
refuses the job otherwise (the client then starts cold). Its own loop is one thread:
a selector over the listening socket and a signal pipe (SIGCHLD) that reaps children and
sends each one's exit status to its client. It exits when its supervisor (the parent)
is gone, when the raydock code on disk is no longer the code it imported, or when its
socket path no longer names its own socket (another process unlinked it and listens
there): it says so and exits with ``PATH_TAKEN``, so its supervisor lets the pool go
rather than show a healthy pool whose jobs reach someone else (clients check their peer,
``trainers.zygote.peer``, and start cold).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time

from api.cluster_contract import RANK_HOST_MODULE
from trainers.own_imports import ROOT
from trainers.zygote.protocol import DRIVERS, code_version, ended_children, recv_request, send_line

# With what local ranks import before their first step (trainers.ranks.preload), so a
# driver or a trial's rank host forks them at once.
PRELOAD = (
    "torch",
    "ray",
    "ray.train",
    "ray.train.torch",
    *DRIVERS.values(),
    "torch._dynamo",
    "sklearn.datasets",
    "trainers.rank_worker",
    "trainers.classifier_loop",
    "trainers.lm_loop",
    RANK_HOST_MODULE,
)
# What Tune imports as a search's driver sets the search up, imported here when installed:
# its usage tag of the run's callbacks imports Ray's tracker integrations (mlflow's takes
# 1.5-8 s on 2 cores), and its default loggers tensorboardX.
SEARCH_PRELOAD = (
    "ray.air.integrations.comet",
    "ray.air.integrations.mlflow",
    "ray.air.integrations.wandb",
    "ray.tune.logger.aim",
    "tensorboardX",
)
ALREADY_SERVED = 3  # exit code: another warm process serves this socket
PATH_TAKEN = 4  # exit code: the socket path names another socket than this process's
REQUEST_TIMEOUT_S = 20.0  # a loaded node may be slow to send


class WarmProcess:
    def __init__(self, path: str, stats_path: str | None, modules: tuple[str, ...], parent: int):
        self.path, self.stats_path = path, stats_path
        self.modules = {*DRIVERS.values(), RANK_HOST_MODULE, *modules}  # what a child may run as __main__
        # The supervisor as it was before the imports: one that died during them is seen gone.
        self.parent = parent  # this process leaves once it is no longer its parent
        self.started = time.time()
        self.code = code_version(ROOT)
        # The install's own import path, without this process's cwd and PYTHONPATH entries.
        own = {os.getcwd(), "", *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
        self.base_path = [p for p in sys.path if p not in own]
        self.children: dict[int, socket.socket] = {}
        self.served = 0
        self.idle_since: float | None = time.time()
        self.stale = False
        self.socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket this process bound
        self.sel = selectors.DefaultSelector()

    def listen(self) -> socket.socket:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                print(f"another warm process already serves {self.path}", file=sys.stderr)
                sys.exit(ALREADY_SERVED)
            except OSError:
                os.unlink(self.path)  # a dead one's socket
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        st = os.stat(self.path)
        self.socket_id = (st.st_dev, st.st_ino)
        sock.listen(64)
        return sock

    def owns_path(self) -> bool:
        """Whether the socket path still names the socket this process bound."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.socket_id

    def serve(self) -> None:
        listener = self.listen()
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
        signal.signal(signal.SIGTERM, self.stop)
        sel = self.sel
        sel.register(listener, selectors.EVENT_READ, "accept")
        sel.register(rfd, selectors.EVENT_READ, "signal")
        self.write_stats()
        print(f"warm process {os.getpid()} ready on {self.path}", flush=True)
        try:
            while os.getppid() == self.parent and not (self.stale and not self.children):
                for key, _ in sel.select(timeout=1.0):
                    if key.data == "accept":
                        conn, _ = listener.accept()
                        self.take(conn, [listener.fileno(), rfd, wfd])
                    elif isinstance(key.data, int):
                        self.hear_client(key.fileobj, key.data)
                    else:
                        try:
                            os.read(rfd, 4096)
                        except BlockingIOError:
                            pass
                self.reap()
                if not self.owns_path():
                    self.leave_taken_path()
        finally:
            self.unlisten()

    def unlisten(self) -> None:
        # Its successor is started only once this process has ended: the path is still its own.
        if self.owns_path():
            os.unlink(self.path)

    def leave_taken_path(self) -> None:
        """Another process unlinked this socket's path (and may listen there): jobs no longer
        reach this process. Its running drivers are their own processes and report their
        own exit codes; the supervisor sees PATH_TAKEN and lets the pool go."""
        print(
            f"warm process {os.getpid()}: {self.path} no longer names its socket (removed or taken by "
            "another process); exiting, jobs on this node start cold",
            file=sys.stderr,
            flush=True,
        )
        os._exit(PATH_TAKEN)

    def stop(self, *_) -> None:
        """SIGTERM (the supervisor lets it go): no interpreter teardown of torch and Ray
        to wait for; running drivers are their own processes and go on."""
        self.unlisten()
        os._exit(0)

    def take(self, conn: socket.socket, inherited: list[int]) -> None:
        """Answer one request: fork its driver, or refuse it (nothing ran)."""
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            request, fds = recv_request(conn)
        except (OSError, ValueError) as exc:
            self.refuse(conn, f"bad request: {exc}")
            return
        reason = self.refusal(conn, request)
        if reason:
            for fd in fds:
                os.close(fd)
            self.refuse(conn, reason)
            return
        conn.settimeout(None)
        pid = os.fork()
        if pid == 0:
            from trainers.zygote.child import become_driver

            become_driver(
                request,
                fds,
                conn,
                [*inherited, self.sel.fileno(), *(c.fileno() for c in self.children.values())],
                self.base_path,
            )
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.sel.register(conn, selectors.EVENT_READ, pid)  # its client hanging up ends the driver
        self.served += 1
        self.idle_since = None
        try:
            send_line(conn, {"accepted": True, "pid": pid})
        except OSError:
            pass  # the client is gone: the child sees it and ends
        self.write_stats()

    def hear_client(self, conn: socket.socket, pid: int) -> None:
        """A driver's client said something or hung up. Gone (SIGKILLed by Ray's stop after
        its grace period, which it cannot relay), it takes the driver's whole process group
        with it. Watched here, so the driver itself runs no watcher thread: it may fork its
        ranks from one thread (trainers.ranks)."""
        try:
            if conn.recv(4096, socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.sel.unregister(conn)
        for kill in (os.killpg, os.kill):  # the group once the child has called setsid, else the child
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
                return

    def refusal(self, conn: socket.socket, request: dict) -> str | None:
        uid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[4:8]
        if int.from_bytes(uid, sys.byteorder) != os.getuid():
            return "another user"
        if request.get("module") not in self.modules:
            return f"unknown driver {request.get('module')!r}"
        if request.get("code") != self.code:
            if os.path.realpath(str(request.get("root"))) == os.path.realpath(ROOT):
                self.stale = True  # the code changed on disk since the import: a fresh process takes over
            return f"other raydock code ({request.get('root')})"
        python = os.path.realpath(sys.executable)
        if request.get("python") != python or request.get("prefix") != sys.prefix:
            return f"another Python ({request.get('python')} in {request.get('prefix')}); this warm process runs {python} in {sys.prefix}"
        if not isinstance(request.get("env"), dict) or not isinstance(request.get("cwd"), str):
            return "no environment or cwd"
        if threading.active_count() != 1:
            return f"{threading.active_count()} threads in the warm process; forking needs one"
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
            return "CUDA was initialised in the warm process"
        return None

    @staticmethod
    def refuse(conn: socket.socket, reason: str) -> None:
        try:
            send_line(conn, {"accepted": False, "reason": reason})
        except OSError:
            pass
        conn.close()

    def reap(self) -> None:
        for pid, code in ended_children() if self.children else ():
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)
            try:
                send_line(conn, {"exit": code})  # the child said it first, unless it was killed
            except OSError:
                pass
            conn.close()
            if not self.children:
                self.idle_since = time.time()
            self.write_stats()

    def write_stats(self) -> None:
        if not self.stats_path:
            return
        facts = {
            "pid": os.getpid(),
            "started": self.started,
            "jobs_served": self.served,
            "running": len(self.children),
            "idle_since": self.idle_since,
        }
        tmp = f"{self.stats_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(facts, f)
        os.replace(tmp, self.stats_path)


def preload() -> tuple[float, list[str]]:
    """Import what the drivers import, and what Tune's set-up imports where installed:
    seconds it took, and the modules imported."""
    t0 = time.perf_counter()
    for name in PRELOAD:
        importlib.import_module(name)
    imported = list(PRELOAD)
    for name in SEARCH_PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
            imported.append(name)
    return time.perf_counter() - t0, imported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the unix socket to listen on")
    parser.add_argument("--stats", help="a JSON file this process keeps its facts in")
    parser.add_argument("--allow", action="append", default=[], help="another module a child may run (tests)")
    parser.add_argument("--parent", type=int, help="the supervisor's pid: this process leaves once it is gone")
    args = parser.parse_args(argv)
    # Named by the supervisor, or the parent now: either way from before the seconds of
    # imports, in which the supervisor may die (then its pid is no longer the parent's).
    parent = args.parent if args.parent else os.getppid()
    took, imported = preload()
    print(f"imported {', '.join(imported)} in {took:.2f}s", flush=True)
    WarmProcess(args.socket, args.stats, tuple(args.allow), parent=parent).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
