"""HAProxy in front of local replicas, for tests and benchmarks: docker/haproxy.cfg itself,
its ``server-template`` (replicas found by name on the compose network) swapped for one
``server`` line per local port, listening on a loopback port of its own, with a stats
socket that says which replicas it sends requests to. Needs the ``haproxy`` binary
(``apt-get install haproxy``)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from service.cluster.local_cluster import free_ports

CONFIG = Path(__file__).resolve().parents[2] / "docker" / "haproxy.cfg"


def local_config(ports: list[int], listen: int, stats: Path) -> str:
    """docker/haproxy.cfg with fixed servers on 127.0.0.1 ``ports`` and ``listen`` as its address."""
    out, section = [], None
    for line in CONFIG.read_text().splitlines():
        if line and not line[0].isspace():
            section = line.split("#", 1)[0].strip()
        words = line.split()
        if section and section.startswith("resolvers "):
            continue  # no Docker DNS here
        if section == "global" and line == section:
            out += [line, f"    stats socket {stats} mode 600 level admin"]
            continue
        if words[:1] == ["bind"]:
            out.append(f"    bind 127.0.0.1:{listen}")
        elif words[:1] == ["server-template"]:
            # The template's options, less how it finds its servers.
            options = [w for w in words[4:] if w not in {"resolvers", "docker", "init-addr", "none"}]
            out += [f"    server r{i} 127.0.0.1:{port} {' '.join(options)}" for i, port in enumerate(ports)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


class Proxy:
    def __init__(self, root: Path, ports: list[int]) -> None:
        self.binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.root = root
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stats = root / "haproxy.sock"
        self.config = root / "haproxy.cfg"
        self.config.write_text(local_config(ports, self.port, self.stats))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Proxy":
        log = open(self.root / "haproxy.log", "ab")
        self.proc = subprocess.Popen([self.binary, "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}; see {self.root / 'haproxy.log'}")
            if self.stats.exists():
                return self
            time.sleep(0.1)
        raise RuntimeError("haproxy did not start")

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.stats))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def up(self) -> set[str]:
        """The servers it sends requests to now (their health checks pass)."""
        rows = [r.split(",") for r in self.command("show stat").splitlines() if r and not r.startswith("#")]
        return {r[1] for r in rows if r[1] not in {"FRONTEND", "BACKEND"} and r[17].startswith("UP")}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
