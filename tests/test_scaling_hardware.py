"""The hardware a job asks for (scaling: gpus_per_worker, accelerator_type,
memory_per_worker, resources_per_worker, placement_strategy): checked in the spec, handed
to Ray's ScalingConfig, refused at submit when no node can ever hold it, and counted by
admission while the job waits."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.config import Config
from pydantic import ValidationError
from sqlalchemy import inspect, text

from api.errors import CapacityExceeded
from api.schemas import ClusterInfo, TrainSpec
from api.schemas.cluster import AutoscalerPublic, NodeInfo, NodeTypeCapacity
from bench.harness.specs import digits_spec
from service.db.engine import make_engine
from service.scheduling import admission, node_fit
from tests.support.specs import user_spec

GIB = 2**30


def spec(**scaling) -> TrainSpec:
    return TrainSpec.model_validate(digits_spec(scaling={"num_workers": 2, **scaling}))


def node(cpus=8.0, gpus=0.0, **more) -> NodeInfo:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), "memory": 32.0 * GIB, **more}
    return NodeInfo(
        node_id=f"n{id(more)}", ip="10.0.0.1", alive=True, is_head=False, cpus=cpus, gpus=gpus, resources=resources
    )


def cluster(*nodes: NodeInfo, autoscaler: AutoscalerPublic | None = None) -> ClusterInfo:
    cpus, gpus = sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)
    return ClusterInfo(
        address="http://ray",
        nodes=list(nodes),
        cpus_total=cpus,
        cpus_free=cpus,
        gpus_total=gpus,
        gpus_free=gpus,
        autoscaler=autoscaler,
    )


# ----------------------------------------------------------------------------- the spec


def test_the_hardware_fields_reach_rays_scaling_config():
    from trainers.trainer import scaling_config

    s = spec(
        gpus_per_worker=0.5,
        accelerator_type="A100",
        memory_per_worker="2GiB",
        resources_per_worker={"infiniband": 1},
        placement_strategy="SPREAD",
    )
    config = scaling_config(s)
    assert config.use_gpu is True
    assert config.resources_per_worker == {"CPU": 1.0, "GPU": 0.5, "memory": 2.0 * GIB, "infiniband": 1.0}
    assert config.accelerator_type == "A100" and config.placement_strategy == "SPREAD"
    assert scaling_config(spec(use_gpu=True)).resources_per_worker == {"CPU": 1.0, "GPU": 1.0}


@pytest.mark.parametrize(
    "scaling, words",
    [
        ({"gpus_per_worker": 1.5}, "whole number"),
        ({"use_gpu": False, "gpus_per_worker": 1}, "use_gpu is false"),
        ({"accelerator_type": "A100"}, "set use_gpu or gpus_per_worker"),
        ({"use_gpu": True, "accelerator_type": "A100; rm"}, "letters, digits"),
        ({"resources_per_worker": {"GPU": 1}}, "scaling.gpus_per_worker"),
        ({"resources_per_worker": {"memory": 1}}, "scaling.memory_per_worker"),
        ({"resources_per_worker": {"accelerator_type:A100": 1}}, "scaling.accelerator_type"),
        ({"resources_per_worker": {"node:10.0.0.1": 1}}, "not a custom resource name"),
        ({"resources_per_worker": {"slot": 0}}, "> 0"),
        ({"resources_per_worker": {f"r{i}": 1 for i in range(17)}}, "at most 16"),
        ({"memory_per_worker": "99PiB"}, "less than or equal"),
        ({"memory_per_worker": "lots"}, "byte string"),
        ({"placement_strategy": "ANYWHERE"}, "STRICT_SPREAD"),
    ],
)
def test_hardware_a_spec_cannot_mean_is_refused_with_what_to_change(scaling, words):
    with pytest.raises(ValidationError) as refused:
        spec(**scaling)
    assert words in str(refused.value)


# ----------------------------------------------------------------------------- can it ever be placed


def test_an_accelerator_type_no_node_has_is_refused_naming_it_and_the_types_there_are():
    info = cluster(node(gpus=8, **{"accelerator_type:H100": 1.0}))
    refusal = node_fit.refusal(spec(use_gpu=True, accelerator_type="A100"), info)
    assert refusal is not None and refusal.details[0]["loc"] == ["scaling", "accelerator_type"]
    assert "accelerator type A100" in refusal.message and "H100" in refusal.message
    assert node_fit.refusal(spec(use_gpu=True, accelerator_type="H100"), info) is None


def test_a_node_type_the_autoscaler_can_add_counts_and_a_full_one_does_not():
    a100 = NodeTypeCapacity(
        name="gpu", resources={"CPU": 16, "GPU": 8, "accelerator_type:A100": 1}, running=0, pending=0
    )
    wanted = spec(use_gpu=True, accelerator_type="A100")
    grows = AutoscalerPublic(node_types=[a100.model_copy(update={"max_workers": 2})], cpus_addable=16, gpus_addable=8)
    full = AutoscalerPublic(node_types=[a100.model_copy(update={"max_workers": 0})], cpus_addable=0, gpus_addable=0)
    assert node_fit.refusal(wanted, cluster(node(), autoscaler=grows)) is None
    assert node_fit.refusal(wanted, cluster(node(), autoscaler=full)) is not None


def test_a_worker_larger_than_any_node_is_refused_naming_the_resource():
    info = cluster(node(cpus=8), node(cpus=8))
    refusal = node_fit.refusal(spec(memory_per_worker="48GiB"), info)
    assert refusal is not None and refusal.details[0]["loc"] == ["scaling", "memory_per_worker"]
    assert "32 GiB" in refusal.message  # the most one node has
    gpus = node_fit.refusal(spec(gpus_per_worker=4), cluster(node(gpus=2), node(gpus=2)))
    assert gpus is not None and gpus.details[0]["loc"] == ["scaling", "gpus_per_worker"]


def test_custom_resources_are_counted_in_total_and_per_node():
    info = cluster(node(slot=1.0), node(slot=1.0))
    assert node_fit.refusal(spec(resources_per_worker={"slot": 1}), info) is None  # one on each node
    total = node_fit.refusal(spec(num_workers=3, resources_per_worker={"slot": 1}), info)
    assert total is not None and "3 slot in all" in total.message
    missing = node_fit.refusal(spec(resources_per_worker={"infiniband": 1}), info)
    assert missing is not None and missing.details[0]["loc"] == ["scaling", "resources_per_worker", "infiniband"]


def test_strict_placements_are_checked_against_the_nodes_shapes():
    two_small = cluster(node(cpus=2), node(cpus=2))
    assert node_fit.refusal(spec(cpus_per_worker=2, placement_strategy="STRICT_SPREAD"), two_small) is None
    assert node_fit.refusal(spec(cpus_per_worker=2, placement_strategy="STRICT_PACK"), two_small) is not None
    one_big = cluster(node(cpus=8))
    assert node_fit.refusal(spec(placement_strategy="STRICT_PACK"), one_big) is None
    assert node_fit.refusal(spec(placement_strategy="STRICT_SPREAD"), one_big) is not None


# ----------------------------------------------------------------------------- admission


def test_admission_counts_accelerator_gpus_and_custom_resources_while_jobs_wait():
    info = cluster(node(gpus=2, **{"accelerator_type:A100": 1.0}), node(gpus=4, **{"accelerator_type:H100": 1.0}))
    a100_job = spec(num_workers=2, use_gpu=True, accelerator_type="A100")
    need = admission.extra_demand(a100_job)
    assert need == {"accelerator_type:A100": 2.0}
    free = admission.extra_free(info, [])
    assert free["accelerator_type:A100"] == 2.0 and free["accelerator_type:H100"] == 4.0
    now = datetime.now(timezone.utc)
    first = admission.Queued("a", 2.0, 2.0, now, extra=need)
    second = admission.Queued("b", 2.0, 2.0, now, extra=need)
    plan = admission.plan(iter([first, second]), (16.0, 6.0), free)
    # 6 GPUs are free in all, but only 2 of them are A100s: the second job waits, and says for what.
    assert plan.start == ["a"]
    assert plan.reasons["b"] == "waiting for resources: needs 2 x A100 GPU, 0 x A100 GPU free"
    held = admission.extra_free(info, [admission.extra_holds(a100_job)])
    assert held["accelerator_type:A100"] == 0.0


def test_the_resource_columns_migration_goes_down_and_up_keeping_the_jobs(database_url):
    engine = make_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority,"
                " restarts, demand_extra) VALUES ('j1', 'n', 'train', 'QUEUED', '{}', '{}', '2026-01-01', 1, 0, 0,"
                " '[]', '{\"slot\": 2.0}')"
            )
        )
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007_event_integers")
    assert not {"demand_extra", "holds_extra"} & {c["name"] for c in inspect(engine).get_columns("jobs")}
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), count(demand_extra) FROM jobs")).one() == (1, 0)


# ----------------------------------------------------------------------------- on the cluster


@pytest.mark.slow
def test_a_custom_resource_reaches_rays_placement_and_a_missing_accelerator_is_refused_at_submit(client):
    job = client.submit(
        user_spec(
            "userpkg.resources:train",
            name="custom-resource",
            scaling={"num_workers": 1, "resources_per_worker": {"raydock_slot": 1}},
        )
    )
    job.wait(timeout=240)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert job.info.latest_metrics["assigned"] == 1.0  # what Ray reserved for the worker
    with pytest.raises(CapacityExceeded) as refused:
        client.submit(digits_spec(name="a100", scaling={"num_workers": 1, "use_gpu": True, "accelerator_type": "A100"}))
    assert "accelerator type A100" in refused.value.message
    assert refused.value.details[0]["loc"] == ["scaling", "accelerator_type"]
    with pytest.raises(CapacityExceeded) as too_many:
        client.submit(
            digits_spec(name="slots", scaling={"num_workers": 1, "resources_per_worker": {"raydock_slot": 9}})
        )
    assert "raydock_slot" in too_many.value.message
