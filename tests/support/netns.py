"""Hosts of the tests' own on one machine: network namespaces, each with its own
address, joined by a bridge in the machine's namespace.

    with NetworkHosts(2) as net:            # 10.X.Y.1 and 10.X.Y.2; the machine is 10.X.Y.254
        net.popen(0, ["ray", "start", ...])  # a process inside host 0

Everything (namespaces, veth pairs, the bridge) carries a name unique to this run and
is removed on exit, with the processes started in the hosts. Needs root and
``ip netns``; ``NetworkHosts.unavailable()`` says why not where they cannot be made.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from service.cluster.local_cluster import _session_pids

MACHINE_HOST_ID = 254


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class NetworkHosts:
    def __init__(self, count: int):
        tag = f"{os.getpid() % 100000}{secrets.token_hex(1)}"  # interface names: at most 15 characters
        self.bridge = f"rdk{tag}br"
        self.namespaces = [f"rdk{tag}n{i}" for i in range(count)]
        self.veths = [(f"rdk{tag}h{i}", f"rdk{tag}p{i}") for i in range(count)]
        self.subnet = _free_subnet()
        self.addresses = [f"{self.subnet}.{i + 1}" for i in range(count)]
        self.machine_address = f"{self.subnet}.{MACHINE_HOST_ID}"
        self.sessions: list[int] = []  # process sessions started in the hosts

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or None when they can."""
        if shutil.which("ip") is None:
            return "the ip command (iproute2) is not installed"
        if os.geteuid() != 0:
            return "network namespaces need root"
        probe = f"rdkprobe{os.getpid() % 100000}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return None

    def __enter__(self) -> "NetworkHosts":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.machine_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns, (outside, inside), address in zip(self.namespaces, self.veths, self.addresses):
                _ip("netns", "add", ns)
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                _ip("link", "set", inside, "netns", ns)
                _ip("link", "set", outside, "master", self.bridge)
                _ip("link", "set", outside, "up")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
                _ip("-n", ns, "link", "set", inside, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def popen(self, host: int, cmd: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen:
        """Start ``cmd`` inside host ``host`` in a process session of its own."""
        out = open(log, "ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[host], *cmd],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.sessions.append(proc.pid)
        return proc

    def interface(self, host: int) -> str:
        """The network interface of host ``host``, inside its namespace."""
        return self.veths[host][1]

    def run(self, host: int, cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.namespaces[host], *cmd], capture_output=True, text=True, timeout=timeout
        )

    def reachable(self) -> str | None:
        """None when host 0 reaches every other host and the machine reaches host 0 over
        TCP; otherwise what failed (a firewall on the bridge, for one)."""
        listener = f"import socket; s = socket.create_server(('{self.addresses[0]}', 0)); print(s.getsockname()[1], flush=True); s.settimeout(20)\nfor _ in range({len(self.addresses)}): s.accept()[0].close()"
        server = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[0], sys.executable, "-c", listener],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            port = int(server.stdout.readline())
            try:
                socket.create_connection((self.addresses[0], port), timeout=5).close()
            except OSError as exc:
                return f"the machine cannot reach {self.addresses[0]}: {exc}"
            for host in range(1, len(self.addresses)):
                probe = self.run(
                    host,
                    [
                        sys.executable,
                        "-c",
                        f"import socket; socket.create_connection(('{self.addresses[0]}', {port}), timeout=5).close()",
                    ],
                )
                if probe.returncode != 0:
                    return f"host {host} cannot reach {self.addresses[0]}: {probe.stderr.strip()[-300:]}"
            return None
        finally:
            server.kill()
            server.wait(10)

    def kill_host_processes(self, session: int, grace: float = 0.0) -> None:
        """End one process session started in a host: SIGKILL at once, as a lost machine."""
        _kill_session(session, grace)

    def close(self) -> None:
        for sid in self.sessions:
            _kill_session(sid, grace=5.0)
        self.sessions.clear()
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        for outside, _ in self.veths:
            _ip("link", "del", outside, check=False)
        _ip("link", "del", self.bridge, check=False)


def _kill_session(sid: int, grace: float) -> None:
    if grace > 0:
        try:
            os.killpg(sid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + grace
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while _session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface or route on the machine uses."""
    taken = _ip("-o", "addr").stdout + _ip("route").stdout
    for _ in range(100):
        subnet = f"10.{random.randint(200, 254)}.{random.randint(0, 254)}"
        if f"{subnet}." not in taken:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet found")
