"""What a job's spec could ask of the scheduler beyond its share, and an admission pass
over a real store to measure what it gets: an elastic range far wider than its project's
quota, and resource names Ray keeps for placement groups. Shared by
tests/test_elastic_grant.py, tests/test_resource_names.py and ``python -m bench.abuse_sched``.
No Ray: the cluster is given as Ray would report it."""

from __future__ import annotations

from api.schemas import ClusterInfo, NodeInfo, QuotaSpec, parse_job_spec
from bench.harness.specs import digits_spec
from service.runtime import Runtime
from service.scheduling import admission, queue
from service.tenancy import quotas

ACTIVE = ("STARTING", "RUNNING", "CANCELLING", "PREEMPTED")
WIDE = {"num_workers": {"min": 1, "max": 4096}}  # one CPU each
PG_ID = "8f3e0c2a1b4d6e7f8a9b0c1d2e3f40010000"  # the form of a placement group id (hex)
PLACEMENT_GROUP_NAMES = [
    f"CPU_group_{PG_ID}",
    f"CPU_group_0_{PG_ID}",
    f"GPU_group_3_{PG_ID}",
    f"bundle_group_{PG_ID}",
    f"bundle_group_1_{PG_ID}",
    f"memory_group_{PG_ID}",
    f"raydock_slot_group_{PG_ID}",
    "bundle",
]


def cluster(cpus: float) -> ClusterInfo:
    """One alive node of ``cpus`` CPUs, all free, as the Ray dashboard reports it."""
    node = NodeInfo(node_id="n1", ip="10.0.0.1", alive=True, is_head=True, cpus=cpus, gpus=0.0)
    return ClusterInfo(
        address="http://ray", nodes=[node], cpus_total=cpus, cpus_free=cpus, gpus_total=0.0, gpus_free=0.0
    )


def submit(service: Runtime, project: str, name: str, scaling: dict) -> str:
    job, _ = service.jobs.submit(parse_job_spec(digits_spec(name=name, project=project, scaling=scaling)))
    return job.id


def admit(service: Runtime, info: ClusterInfo, ceiling: bool = True) -> tuple[admission.Plan, dict]:
    """One admission pass over the store's queue and project loads with the cluster as
    ``info``, as the queue keeper makes it (``ceiling`` False: no cluster clamp); returns
    the plan and the loads as the plan left them."""
    with service.sessions() as s:
        held, held_extra = queue.held(s, ACTIVE)
        loads = quotas.loads(s, ACTIVE, QuotaSpec(), 3600)
        heads = {p: queue.head(s, set(), project=p) for p in loads}
        free = admission.free(info, held, (0.0, 0.0))
        kw = {"ceiling": admission.Ceiling(*admission.max_capacity(info, (0.0, 0.0)))} if ceiling else {}
        plan = admission.plan(
            admission.fair_order(heads, loads), free, admission.extra_free(info, held_extra), loads, **kw
        )
    return plan, loads
