"""raydock on an autoscaling cluster: Ray's fake multi-node provider on this machine
(bench/harness/clusters.py), a head with no CPUs and up to two 1-CPU worker nodes.

The cluster has nothing to train on until the autoscaler adds nodes, so every job here
needs more than is present: the submit check and the queue must count what the
autoscaler can add, the job must start, make the autoscaler add nodes, and succeed; the
idle nodes must then go away.

One to 2.5 minutes on a busy 2-core machine, so it runs only with
``RAYDOCK_TEST_FAKE_CLUSTER=1`` (as the fake-cluster check in tests/test_docker_cluster.py).
The parsing of the autoscaler's report is checked on every run by
tests/test_autoscaler_report.py.
"""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from bench.harness.clusters import WORKER_TYPE, start_fake_autoscaling_head
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("RAYDOCK_TEST_FAKE_CLUSTER") != "1",
        reason="starts an autoscaling Ray cluster (1-2.5 min); set RAYDOCK_TEST_FAKE_CLUSTER=1 to run",
    ),
    pytest.mark.serial,  # a Ray cluster of its own
]


@pytest.fixture(scope="module")
def autoscaling(tmp_path_factory):
    work = tmp_path_factory.mktemp("autoscaling")
    head, config = start_fake_autoscaling_head(work / "ray", worker_cpus=1, max_workers=2, idle_timeout_s=6)
    server = None
    try:
        server = ServerProcess(
            work / "server",
            head.dashboard_url,
            # Nodes take a while to appear: a fixed-size job waits for them this long.
            extra_env={"RAYDOCK_AUTOSCALER_CONFIG": str(config), "RAYDOCK_WORKER_START_TIMEOUT_S": "240"},
        ).start()
        yield server
    finally:
        if server is not None:
            server.stop()
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def alive_nodes(http: httpx.Client) -> list[dict]:
    return [n for n in http.get("/v1/cluster").json()["nodes"] if n["alive"]]


def test_job_needing_more_than_present_scales_the_cluster_up_and_down(autoscaling):
    http = httpx.Client(base_url=autoscaling.url, timeout=30)
    cluster = http.get("/v1/cluster").json()
    assert cluster["cpus_total"] == 0
    scaler = cluster["autoscaler"]
    assert scaler["cpus_addable"] == 2 and scaler["limits_from"]
    assert {t["name"]: t["max_workers"] for t in scaler["node_types"]}[WORKER_TYPE] == 2

    # More than the autoscaler can ever add: refused at submit, naming the autoscaler.
    too_big = http.post("/v1/jobs", json={"model": {"type": "mlp"}, "scaling": {"num_workers": 3}})
    assert too_big.status_code == 422
    assert too_big.json()["error"]["code"] == "exceeds_cluster_capacity"
    assert "counting what its autoscaler can add" in too_big.json()["error"]["message"]

    # Two workers on a cluster with no CPUs: accepted, started, and given nodes.
    spec = {
        "name": "grows",
        "model": {"type": "mlp", "hidden_sizes": [32]},
        "batch_size": 32,
        "epochs": 3,
        "scaling": {"num_workers": 2},
    }
    r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = wait_for(
        lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["status"] in ("SUCCEEDED", "FAILED") and j,
        420,
        "the job to end",
    )
    assert job["status"] == "SUCCEEDED", job
    group = http.get(f"/v1/jobs/{job_id}/worker-groups").json()[0]
    head_id = next(n["node_id"] for n in cluster["nodes"] if n["is_head"])
    assert group["world_size"] == 2 and head_id not in {n["node_id"] for n in group["nodes"]}
    assert [p["metrics"]["world_size"] for p in http.get(f"/v1/jobs/{job_id}/metrics").json()] == [2, 2, 2]

    # Idle nodes go away again (idle_timeout 6 s).
    wait_for(lambda: len(alive_nodes(http)) == 1, 120, "the idle nodes to be removed")
