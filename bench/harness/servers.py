"""A raydock server run as a real subprocess on a free port, for tests and benchmarks."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.cluster.local_cluster import free_ports

REPO = Path(__file__).resolve().parents[2]


class ServerProcess:
    """``ray_address`` None: the server starts a Ray head of its own (in its data dir).
    Jobs may ship code from the checkout (``RAYDOCK_CODE_ROOT``) unless ``extra_env``
    says otherwise; ``unset_env`` names variables of this process the server must not see.
    ``live`` holds the servers started and not stopped since: tests/support/cluster_teardown.py
    cancels through them what a test left running."""

    live: set["ServerProcess"] = set()

    def __init__(
        self,
        data_dir: Path,
        ray_address: str | None,
        *,
        token: str | None = None,
        port: int | None = None,
        extra_env: dict[str, str] | None = None,
        unset_env: tuple[str, ...] = (),
        cwd: Path | None = None,
        python: str | None = None,
        nofile: int | None = None,
        argv: list[str] | None = None,
    ):
        self.data_dir, self.ray_address, self.token = data_dir, ray_address, token
        self.port = port or free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = extra_env or {}
        self.unset_env = unset_env
        self.cwd = cwd  # None: this process's working directory
        self.python = python or sys.executable  # another environment's Python runs another install of raydock
        self.nofile = nofile  # the server's file descriptor limit (soft and hard); None: this process' own
        self.argv = argv or ["-m", "service.cli", "serve"]  # after the Python executable
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        env = {k: v for k, v in os.environ.items() if k not in self.unset_env and k != "RAY_ADDRESS"}
        env.update(RAYDOCK_DATA_DIR=str(self.data_dir), RAYDOCK_PORT=str(self.port), RAYDOCK_CODE_ROOT=str(REPO))
        if self.ray_address:
            env["RAY_ADDRESS"] = self.ray_address
        env.update(self.extra_env)
        if self.token:
            env["RAYDOCK_API_TOKEN"] = self.token
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [self.python, *self.argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            preexec_fn=self._limits if self.nofile else None,
        )
        ServerProcess.live.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.data_dir / 'server.log'}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def _limits(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, as in a crash."""
        ServerProcess.live.discard(self)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        ServerProcess.live.discard(self)
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
