"""A local Ray head that raydock starts for itself when no ``RAY_ADDRESS`` is given.

The head runs as ``ray start --head --block`` in its own process session, on ports of
its own, so it survives a crash of the API process (running jobs keep training) and a
restarted server finds it again from ``cluster.json``. It is stopped by the process id
raydock started, never with ``ray stop``, which would kill every Ray on the machine.

What the head is given is chosen, not inherited: it listens on 127.0.0.1 only, runs with
Ray token auth when a token file is named (the server always names one, and creates it
0600), and gets an allowlisted environment. Every job's code runs in processes forked
from this head, so whatever the head's environment holds (the API token, the database
URL, cloud keys) user code could read. The one exception made on purpose: when the
storage is an object store, the head gets that store's variables (``STORAGE_ENV``: the
``AWS_*`` credentials, endpoint and region for ``s3://``), as every node of a cluster on
object storage holds them, since its drivers and workers read and write checkpoints there.
They go into the head's environment only: never into ``cluster.json``, a launch file or
a log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from service.cluster.ray_backend import ray_auth_token

log = logging.getLogger("raydock")

LOOPBACK = "127.0.0.1"
# Ray's single-machine mode: the head's GCS, raylet and agents listen on 127.0.0.1, and a
# driver started outside Ray (ray.init from a bench) needs it too, or Ray rewrites the
# loopback GCS address to the machine's address, where nothing listens.
SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# What the head (and so every job's driver and workers) may inherit from the server.
# Anything else (RAYDOCK_* such as the API token and the database URL, cloud keys,
# RAY_ADDRESS of another cluster) stays with the server.
HEAD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
    }
)
HEAD_ENV_PREFIXES = ("LC_", "PYTHON", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "TORCH_", "RAY_", "AUTOSCALER_")
HEAD_ENV_DENIED = frozenset({"RAY_ADDRESS"})
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
# What the nodes need to reach the storage, by the storage URI's scheme: the variables
# pyarrow (and the SDKs under it) read for that store. Local storage needs none.
STORAGE_ENV: dict[str, tuple[str, ...]] = {
    "s3": ("AWS_",),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_"),
    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_"),
    "abfs": ("AZURE_",),
    "abfss": ("AZURE_",),
}


@dataclass
class LocalHead:
    pid: int
    gcs_address: str
    dashboard_url: str
    temp_dir: str  # private (0700); Ray's own temp dir is inside it
    log_path: str
    auth_token_path: str | None = None  # None: the head runs without token auth (or with Ray's own settings)

    def auth_token(self) -> str | None:
        if self.auth_token_path is None:
            return ray_auth_token()
        try:
            return Path(self.auth_token_path).read_text().strip() or None
        except OSError:
            return None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {t}"} if (t := self.auth_token()) else {}

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        try:
            return httpx.get(self.dashboard_url + "/api/version", headers=self.headers, timeout=3).status_code == 200
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


def head_env(extra: dict[str, str] | None = None, *, auth_token_path: Path | None = None) -> dict[str, str]:
    """The allowlisted part of this process's environment, ``extra`` on top.

    Job drivers run ``python -m trainers.driver``: this interpreter goes first on PATH.
    With ``auth_token_path`` the head runs with token auth from that file, whatever
    Ray auth settings this process has.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in HEAD_ENV_NAMES or k.startswith(HEAD_ENV_PREFIXES)) and k not in HEAD_ENV_DENIED
    }
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    if auth_token_path is not None:
        for k in AUTH_ENV:
            env.pop(k, None)
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(auth_token_path))
    return {**env, **(extra or {})}


def storage_env(storage_path: str | None) -> dict[str, str]:
    """The variables of this process's environment the nodes need to reach ``storage_path``
    (``STORAGE_ENV`` by its scheme); none for a local path."""
    if not storage_path or "://" not in storage_path:
        return {}
    prefixes = STORAGE_ENV.get(storage_path.split("://", 1)[0].lower(), ())
    return {k: v for k, v in os.environ.items() if prefixes and k.startswith(prefixes)}


def ensure_token(path: Path) -> Path:
    """A Ray auth token file readable by this user only, created when missing."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        if path.stat().st_uid == os.geteuid():
            path.chmod(0o600)
        if not path.read_text().strip():
            raise RuntimeError(f"the Ray auth token file {path} is empty; delete it and raydock writes a new one")
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def start_head(
    state_dir: Path,
    *,
    num_cpus: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    autoscaling_config: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    auth_token_path: Path | None = None,
) -> LocalHead:
    """Start a Ray head on free ports of 127.0.0.1 and wait until its dashboard answers.

    ``auth_token_path``: run with Ray token auth, the token read from that file (created
    0600 when missing). ``autoscaling_config`` runs an autoscaler with that cluster
    config; for Ray's fake multi-node provider (``provider.type: fake_multinode``, nodes
    as extra raylets on this machine) the GCS address is filled in so its nodes join this
    head rather than port 6379. ``extra_args`` go last on the ``ray start`` line (a
    repeated flag wins).
    """
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if auth_token_path is not None:
        ensure_token(auth_token_path)
    # Unix socket paths are limited to ~107 bytes: keep Ray's temp dir short. Ray makes
    # its temp dir world-writable; job logs and uploaded code land there, so it goes
    # inside a directory of this user only.
    digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:8]
    temp_dir = f"/tmp/raydock-{digest}-{os.getpid()}"
    os.makedirs(temp_dir, mode=0o700, exist_ok=True)
    os.chmod(temp_dir, 0o700)
    gcs, dash, client, agent_http, agent_grpc, node_mgr, obj_mgr, metrics, rt_env = free_ports(9)
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray_bin,
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={LOOPBACK}",
        f"--port={gcs}",
        f"--dashboard-port={dash}",
        f"--dashboard-host={LOOPBACK}",
        "--include-dashboard=true",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--node-manager-port={node_mgr}",
        f"--object-manager-port={obj_mgr}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={rt_env}",
        f"--temp-dir={temp_dir}/r",
    ]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    # `ray start` swaps --node-ip-address=127.0.0.1 for the machine's address unless Ray
    # is in single-machine mode; in that mode GCS, raylet and agents listen on 127.0.0.1.
    env = {**SINGLE_MACHINE_ENV, **(env or {})}
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
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=head_env(env, auth_token_path=auth_token_path),
    )
    token_path = str(auth_token_path) if auth_token_path is not None else None
    head = LocalHead(proc.pid, f"{LOOPBACK}:{gcs}", f"http://{LOOPBACK}:{dash}", temp_dir, str(log_path), token_path)
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
    from api.errors import ClusterUnavailable
    from service.cluster.ray_backend import RayBackend

    try:
        return RayBackend(head.dashboard_url, auth_token=head.auth_token()).cluster_info().cpus_total > 0
    except (ClusterUnavailable, KeyError, TypeError):
        return False


def _has_node(head: LocalHead) -> bool:
    from api.errors import ClusterUnavailable
    from service.cluster.ray_backend import RayBackend

    try:
        return any(n.alive for n in RayBackend(head.dashboard_url, auth_token=head.auth_token()).cluster_info().nodes)
    except (ClusterUnavailable, KeyError, TypeError):
        return False


def _with_gcs_address(config: dict[str, Any], gcs_port: int) -> dict[str, Any]:
    provider = dict(config.get("provider", {}))
    if provider.get("type") == "fake_multinode" and "gcs_address" not in provider:
        # Without it the fake provider points its nodes at <node ip>:6379.
        provider["gcs_address"] = f"{LOOPBACK}:{gcs_port}"
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


def ensure_head(
    state_dir: Path,
    *,
    num_cpus: int | None = None,
    auth_token_path: Path | None = None,
    storage_path: str | None = None,
) -> LocalHead:
    """The head a previous server left running (with the token and storage variables it
    was started with), or a new one whose nodes reach ``storage_path`` (``storage_env``)."""
    head = find_head(state_dir)
    if head is None:
        return start_head(state_dir, num_cpus=num_cpus, auth_token_path=auth_token_path, env=storage_env(storage_path))
    if auth_token_path is not None and head.auth_token_path != str(auth_token_path):
        log.warning(
            "the running local Ray head (pid %s) was not started with the token file %s; it is kept so its jobs "
            "go on. Stop it (kill -TERM -%s) while no job runs, and the next start makes one with token auth on 127.0.0.1.",
            head.pid,
            auth_token_path,
            head.pid,
        )
    return head
