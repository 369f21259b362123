"""Reading the autoscaler out of the dashboard's ``/api/cluster_status``
(service/cluster/autoscaler.py), on reports recorded from Ray 2.60 clusters: a plain head (the
read-only provider every head runs) and the fake multi-node autoscaler of
bench/harness/clusters.py before, during and after a scale-up."""

from __future__ import annotations

from api.schemas import ClusterInfo
from bench.harness.clusters import HEAD_TYPE, WORKER_TYPE, fake_autoscaling_config
from service.cluster.autoscaler import addable, autoscaler_from_status

HEAD_ID = "f" * 51 + "00000"
NODE_1, NODE_2 = "f" * 51 + "00001", "f" * 51 + "00002"

PLAIN_HEAD = {
    "activeNodes": {"nodeB006F40B9197F77A20541A0163Ede8Ab87B2D6D83Cfc33Db814E2F41": 1},
    "idleNodes": None,
    "pendingNodes": [],
    "pendingLaunches": {},
    "failedNodes": [],
    "nodeTypeMapping": {
        "b006f40b9197f77a20541a0163ede8ab87b2d6d83cfc33db814e2f41": "node_b006f40b9197f77a20541a0163ede8ab87b2d6d83cfc33db814e2f41"
    },
    "legacy": True,
}
FAKE_IDLE = {
    "activeNodes": {HEAD_TYPE: 1},
    "idleNodes": None,
    "pendingNodes": [],
    "pendingLaunches": {},
    "failedNodes": [],
    "nodeTypeMapping": {HEAD_ID: HEAD_TYPE},
    "legacy": True,
}
FAKE_LAUNCHING = {
    "activeNodes": {HEAD_TYPE: 1},
    "idleNodes": None,
    "pendingNodes": [[NODE_1, WORKER_TYPE, "uninitialized"]],
    "pendingLaunches": {WORKER_TYPE: 1},
    "failedNodes": [],
    "pendingResources": {"CPU": 2, "objectStoreMemory": 300000000},
    "nodeTypeMapping": {HEAD_ID: HEAD_TYPE, NODE_1: WORKER_TYPE},
    "legacy": True,
}
FAKE_FULL = {
    "activeNodes": {HEAD_TYPE: 1, WORKER_TYPE: 2},
    "idleNodes": None,
    "pendingNodes": [],
    "pendingLaunches": {},
    "failedNodes": [],
    "nodeTypeMapping": {HEAD_ID: HEAD_TYPE, NODE_1: WORKER_TYPE, NODE_2: WORKER_TYPE},
    "legacy": True,
}

CONFIG = fake_autoscaling_config(worker_cpus=1, max_workers=2)


def status(report: dict | None) -> dict:
    return {"autoscalerReport": report, "loadMetricsReport": {"usage": {}}}


def test_a_plain_head_has_no_autoscaler():
    assert autoscaler_from_status(status(PLAIN_HEAD), None) is None
    assert autoscaler_from_status(status(None), None) is None  # no report yet


def test_fake_autoscaler_with_its_config_counts_what_it_can_add():
    idle = autoscaler_from_status(status(FAKE_IDLE), CONFIG, "autoscaling.json")
    assert (idle.cpus_addable, idle.gpus_addable, idle.limits_from) == (2, 0, "autoscaling.json")
    worker = next(t for t in idle.node_types if t.name == WORKER_TYPE)
    assert (worker.running, worker.pending, worker.max_workers, worker.resources["CPU"]) == (0, 0, 2, 1)

    # Launching nodes are not present yet: they are still part of what it adds.
    launching = autoscaler_from_status(status(FAKE_LAUNCHING), CONFIG)
    worker = next(t for t in launching.node_types if t.name == WORKER_TYPE)
    assert (worker.running, worker.pending, launching.cpus_addable) == (0, 2, 2)

    full = autoscaler_from_status(status(FAKE_FULL), CONFIG)
    assert full.cpus_addable == 0


def test_cluster_wide_max_workers_bounds_what_it_can_add():
    config = {**CONFIG, "max_workers": 1}
    assert autoscaler_from_status(status(FAKE_IDLE), config).cpus_addable == 1


def test_an_autoscaler_of_unknown_limits_counts_as_unbounded():
    scaler = autoscaler_from_status(status(FAKE_IDLE), None)
    assert scaler is not None and scaler.cpus_addable is None
    info = ClusterInfo(address="x", nodes=[], cpus_total=0, cpus_free=0, gpus_total=0, gpus_free=0, autoscaler=scaler)
    assert addable(info) == (float("inf"), float("inf"))


def test_node_type_names_come_back_from_camel_cased_keys():
    # The dashboard camel-cases dict keys: a type named cpu_workers is `cpuWorkers` in
    # activeNodes / pendingLaunches but keeps its name in nodeTypeMapping.
    config = {
        **CONFIG,
        "available_node_types": {
            HEAD_TYPE: CONFIG["available_node_types"][HEAD_TYPE],
            "cpu_workers": CONFIG["available_node_types"][WORKER_TYPE],
        },
    }
    report = {
        **FAKE_IDLE,
        "activeNodes": {HEAD_TYPE: 1, "cpuWorkers": 1},
        "pendingLaunches": {"cpuWorkers": 1},
        "nodeTypeMapping": {HEAD_ID: HEAD_TYPE, NODE_1: "cpu_workers"},
    }
    scaler = autoscaler_from_status(status(report), config)
    worker = next(t for t in scaler.node_types if t.name == "cpu_workers")
    assert (worker.running, worker.pending, scaler.cpus_addable) == (1, 1, 1)
