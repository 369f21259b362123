"""Two Ray nodes on two hosts of the test's own (network namespaces with their own
addresses, tests/support/netns.py): the head in one, a worker node in the other, one CPU each,
and the raydock server on the machine reaching the head's dashboard over a bridge.

An elastic job of 1..2 workers of one CPU must spread over both hosts; killing every
Ray process of the worker host (as a lost machine) makes it restart from its last
checkpoint on the head alone and finish. Opt-in (long): a job of one rank per host whose
storage is the suite's S3 endpoint, on the machine's address on the bridge, and no path on
disk, checkpoints there and its checkpoint downloads through the API. Skipped where
namespaces cannot be made.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from api.client import Client
from api.errors import ClusterUnavailable
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import run_to_end, wait_for
from service.cluster.local_cluster import free_ports, head_env
from service.cluster.ray_backend import RayBackend
from service.files import storage
from tests.support.netns import NetworkHosts
from tests.support.object_store import NODE_ENV, S3Server
from tests.support.session import session_token_path

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # starts a cluster of its own

RAY = str(Path(sys.executable).with_name("ray"))
# Ray notices a node whose raylet is gone by missed health checks (default: 5 misses
# 3 s apart); faster here so the job's restart sees the one host that is left.
HEAD_ENV = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
}
OBJECT_STORE = str(100 * 1024 * 1024)


def ray_node_cmd(
    temp_dir: str, address: str, *, head_port: int | None = None, join: str | None = None, dashboard_port: int = 0
) -> list[str]:
    cmd = [
        RAY,
        "start",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={address}",
        "--num-cpus=1",
        f"--object-store-memory={OBJECT_STORE}",
        f"--temp-dir={temp_dir}",
    ]
    if join:
        return [*cmd, f"--address={join}"]
    return [
        *cmd,
        "--head",
        f"--port={head_port}",
        "--include-dashboard=true",
        "--dashboard-host=0.0.0.0",
        f"--dashboard-port={dashboard_port}",
    ]


def gloo_env(env: dict[str, str], net: NetworkHosts, host: int) -> dict[str, str]:
    # Gloo binds to the address the host name resolves to, which is not in the
    # namespace; the workers (children of the node's raylet) use the host's interface.
    return {**env, "GLOO_SOCKET_IFNAME": net.interface(host)}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    if reason := NetworkHosts.unavailable():
        pytest.skip(f"cannot make network namespaces here: {reason}")
    work = tmp_path_factory.mktemp("multinode")
    # Ray's unix socket paths must stay short: its temp dirs go under /tmp, not pytest's tmp_path.
    temp_dirs = [tempfile.mkdtemp(prefix="rdk-mn-", dir="/tmp") for _ in range(2)]
    server = None
    with NetworkHosts(2) as net:
        try:
            if reason := net.reachable():
                pytest.skip(f"the namespaces cannot reach each other: {reason}")
            head_ip, worker_ip = net.addresses
            gcs, dash = free_ports(2)  # each namespace has its own ports; these only need to differ from each other
            # Token auth with the run's own token (tests/conftest.py); a joining node sends it too.
            # The nodes hold the test S3 endpoint's credentials, as a cluster on object storage does.
            env = head_env({**HEAD_ENV, **NODE_ENV}, auth_token_path=session_token_path())
            head = net.popen(
                0,
                ray_node_cmd(temp_dirs[0], head_ip, head_port=gcs, dashboard_port=dash),
                env=gloo_env(env, net, 0),
                log=work / "head.log",
            )
            dashboard = f"http://{head_ip}:{dash}"
            backend = RayBackend(dashboard)
            worker = None

            def alive_nodes() -> list:
                for proc, log in ((head, "head.log"), (worker, "worker.log")):
                    if proc is not None and proc.poll() is not None:
                        raise RuntimeError(
                            f"ray start exited with {proc.returncode}: {(work / log).read_text()[-2000:]}"
                        )
                try:
                    return [n for n in backend.cluster_info().nodes if n.alive]
                except (ClusterUnavailable, KeyError, TypeError):
                    return []

            wait_for(lambda: alive_nodes(), 240, "the head node on its host")
            worker = net.popen(
                1,
                ray_node_cmd(temp_dirs[1], worker_ip, join=f"{head_ip}:{gcs}"),
                env=gloo_env(env, net, 1),
                log=work / "worker.log",
            )
            wait_for(lambda: len(alive_nodes()) == 2, 240, "the worker node to join")
            # A restart right after the loss may be sized for the lost node (Ray has not yet
            # marked it dead); its start then times out and the next one fits the head.
            server = ServerProcess(
                work / "server", dashboard, extra_env={"RAYDOCK_WORKER_START_TIMEOUT_S": "20"}
            ).start()
            yield {
                "net": net,
                "server": server,
                "dashboard": dashboard,
                "head_ip": head_ip,
                "worker_ip": worker_ip,
                "worker_session": worker.pid,
            }
        finally:
            if server is not None:
                server.stop()
            net.close()  # the Ray processes first, then their temp dirs
            for d in temp_dirs:
                shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def bridge_s3(two_hosts):
    """The S3 endpoint on the machine's address on the bridge, which both hosts reach."""
    s3 = S3Server(host=two_hosts["net"].machine_address).start()
    yield s3
    s3.stop()


# Before the test that loses the worker host: this one needs both. Opt-in for time.
@pytest.mark.long
def test_a_job_on_two_hosts_whose_only_shared_storage_is_s3_checkpoints_there(two_hosts, bridge_s3, tmp_path):
    base = bridge_s3.fresh_prefix()
    env = {**bridge_s3.env(), "RAYDOCK_STORAGE_PATH": base}
    server = ServerProcess(tmp_path / "server", two_hosts["dashboard"], extra_env=env).start(timeout=180)
    try:
        with Client(server.url) as client:
            job = client.submit(
                digits_spec(name="two-hosts-s3", epochs=3, scaling={"num_workers": 2, "cpus_per_worker": 1})
            )
            run_to_end(job, 300)
            assert job.status.value == "SUCCEEDED", job.info.error
            groups = httpx.get(f"{server.url}/v1/jobs/{job.id}/worker-groups", timeout=30).json()
            ips = sorted(n["ip"] for n in groups[0]["nodes"])
            assert ips == sorted([two_hosts["head_ip"], two_hosts["worker_ip"]])  # one rank per host
            checkpoints = job.checkpoints()
            prefix = storage.job_prefix(base, job.id)
            assert checkpoints and all(c.path.startswith(prefix + "/") for c in checkpoints)
            last = max(checkpoints, key=lambda c: c.epoch)
            restored = job.download_checkpoint(last, dest=tmp_path / "restored")
            assert json.loads((restored / "state.json").read_text())["epoch"] == 3
            assert json.loads((restored / "state.json").read_text())["world_size"] == 2
    finally:
        server.stop()


def test_elastic_job_spans_two_hosts_and_continues_on_the_head_when_one_is_lost(two_hosts):
    net, server = two_hosts["net"], two_hosts["server"]
    head_ip, worker_ip = two_hosts["head_ip"], two_hosts["worker_ip"]
    http = httpx.Client(base_url=server.url, timeout=30)
    spec = {
        "name": "two-hosts",
        "model": {"type": "mlp", "hidden_sizes": [32]},
        "batch_size": 32,
        "epochs": 25,
        "scaling": {"num_workers": {"min": 1, "max": 2}},
    }
    r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]

    def groups() -> list[dict]:
        return http.get(f"/v1/jobs/{job_id}/worker-groups").json()

    first = wait_for(lambda: groups(), 240, "the first worker group")[0]
    assert first["world_size"] == 2
    assert sorted(n["ip"] for n in first["nodes"]) == sorted([head_ip, worker_ip])  # one worker per host
    wait_for(lambda: http.get(f"/v1/jobs/{job_id}/metrics").json(), 240, "a report from both hosts")

    net.kill_host_processes(two_hosts["worker_session"])  # SIGKILL every Ray process of the worker host
    lost_at = time.time()

    job = wait_for(
        lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["status"] in ("SUCCEEDED", "FAILED") and j,
        300,
        "the job to end",
    )
    assert job["status"] == "SUCCEEDED", job
    after = [g for g in groups() if g["ts"] > lost_at]
    assert after and all(g["world_size"] == 1 and [n["ip"] for n in g["nodes"]] == [head_ip] for g in after), groups()
    assert job["restarts"], "the lost host shows as a worker failure"
    series = http.get(f"/v1/jobs/{job_id}/metrics").json()
    sizes = [p["metrics"]["world_size"] for p in series]
    assert sizes[0] == 2 and sizes[-1] == 1, sizes
    epochs = [p["epoch"] for p in series]
    assert epochs[-1] == 25
    assert epochs.count(1) == 1, epochs  # the restart resumed from a checkpoint, not from scratch
