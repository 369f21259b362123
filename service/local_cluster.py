"""A local Ray head that raydock starts for itself when no ``RAY_ADDRESS`` is given.

The head runs as ``ray start --head --block`` in its own process session, on ports of
its own, so it survives a crash of the API process (running jobs keep training) and a
restarted server finds it again from ``cluster.json``. It is stopped by the process id
raydock started, never with ``ray stop``, which would kill every Ray on the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from service.ray_backend import ray_auth_token


@dataclass
class LocalHead:
    pid: int
    gcs_address: str
    dashboard_url: str
    temp_dir: str
    log_path: str

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        try:
            headers = {"Authorization": f"Bearer {t}"} if (t := ray_auth_token()) else {}
            return httpx.get(self.dashboard_url + "/api/version", headers=headers, timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace: float = 5.0) -> None:
        """Stop the head and everything in the process session it was started in."""
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + grace
        while _session_pids(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in _session_pids(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _session_pids(sid: int) -> list[int]:
    """Processes of the session ``sid``: the head started its session, and every Ray
    daemon and worker under it inherited it."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after "(comm)": state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


def _head_env(extra: dict[str, str] | None) -> dict[str, str]:
    """Job drivers run ``python -m trainers.driver``: put this interpreter first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), **(extra or {})}


def start_head(
    state_dir: Path,
    *,
    num_cpus: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
    autoscaling_config: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
) -> LocalHead:
    """Start a Ray head on free ports and wait until its dashboard answers.

    ``autoscaling_config`` runs an autoscaler with that cluster config; for Ray's fake
    multi-node provider (``provider.type: fake_multinode``, nodes as extra raylets on
    this machine) the GCS address is filled in so its nodes join this head rather than
    port 6379. ``extra_args`` go last on the ``ray start`` line (a repeated flag wins).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    # Unix socket paths are limited to ~107 bytes: keep Ray's temp dir short.
    digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:8]
    temp_dir = f"/tmp/raydock-{digest}-{os.getpid()}"
    gcs, dash, client, agent_http, agent_grpc, node_mgr, obj_mgr, metrics, rt_env = free_ports(9)
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray_bin, "start", "--head", "--block", "--disable-usage-stats",
        f"--port={gcs}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--node-manager-port={node_mgr}",
        f"--object-manager-port={obj_mgr}", f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={rt_env}",
        f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    env = dict(env or {})
    if autoscaling_config is not None:
        config_path = state_dir / "autoscaling.json"
        config_path.write_text(json.dumps(_with_gcs_address(autoscaling_config, gcs)))
        cmd.append(f"--autoscaling-config={config_path}")
        if autoscaling_config.get("provider", {}).get("type") == "fake_multinode":
            env.setdefault("RAY_FAKE_CLUSTER", "1")  # the fake provider refuses to run without it
    cmd.extend(extra_args)
    log_path = state_dir / "head.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=_head_env(env),
    )  # fmt: skip
    head = LocalHead(proc.pid, f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", temp_dir, str(log_path))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}; see {log_path}")
        # A head with no CPUs (its work goes to other nodes) is ready once it has registered.
        if head.alive() and (_has_node(head) if num_cpus == 0 else _has_cpus(head)):
            (state_dir / "cluster.json").write_text(json.dumps(asdict(head)))
            return head
        time.sleep(0.5)
    head.stop()
    raise RuntimeError(f"local Ray head did not come up in {timeout:.0f}s; see {log_path}")


def _has_cpus(head: LocalHead) -> bool:
    """The dashboard answers before the head node has registered its resources."""
    from service.ray_backend import ClusterUnavailable, RayBackend

    try:
        return RayBackend(head.dashboard_url).cluster_info().cpus_total > 0
    except (ClusterUnavailable, KeyError, TypeError):
        return False


def _has_node(head: LocalHead) -> bool:
    from service.ray_backend import ClusterUnavailable, RayBackend

    try:
        return any(n.alive for n in RayBackend(head.dashboard_url).cluster_info().nodes)
    except (ClusterUnavailable, KeyError, TypeError):
        return False


def _with_gcs_address(config: dict[str, Any], gcs_port: int) -> dict[str, Any]:
    provider = dict(config.get("provider", {}))
    if provider.get("type") == "fake_multinode" and "gcs_address" not in provider:
        from ray._private.services import get_node_ip_address

        # Without it the fake provider points its nodes at <node ip>:6379.
        provider["gcs_address"] = f"{get_node_ip_address()}:{gcs_port}"
    return {**config, "provider": provider}


def find_head(state_dir: Path) -> LocalHead | None:
    """The head a previous server started, if it still runs."""
    path = state_dir / "cluster.json"
    if not path.is_file():
        return None
    try:
        head = LocalHead(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None
    return head if head.alive() else None


def ensure_head(state_dir: Path, *, num_cpus: int | None = None) -> LocalHead:
    return find_head(state_dir) or start_head(state_dir, num_cpus=num_cpus)
