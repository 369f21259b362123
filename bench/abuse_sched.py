"""What a job's spec can take from the scheduler, measured against its bounds.

    .venv/bin/python -m bench.abuse_sched

On a real SQLite store with raydock's admission logic, the cluster given as Ray reports
it, and a real server over HTTP for the spec checks (no Ray). One row per figure,
``what | figure | bound | ok/FAIL``:

- an elastic range of 1..4096 workers in a project with max_cpus 2: the CPUs it is
  counted as holding, the max its driver hands Ray Train, and whether it is borrowed beyond
  its 1-CPU guarantee and chosen for preemption by another project's guaranteed job;
- the same range with no quota on a 64-CPU cluster: what it holds, at most the cluster;
- 200 such ranges in 10 projects of max_cpus 8 on a 4,096-CPU cluster: the most CPUs any
  project holds after admission, and the CPUs held in all;
- Ray's placement-group resource names in ``scaling.resources_per_worker``: how many of
  their forms a submit gets through.

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from api.schemas import QuotaSpec
from bench.figures import row, run_attacks
from bench.harness.jobstore import dead_ray, job_service, set_columns
from bench.harness.sched_attacks import PLACEMENT_GROUP_NAMES, WIDE, admit, cluster, submit
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.db.models import utcnow
from service.files import storage
from service.scheduling import fair_share, queue
from service.tenancy import quotas


def wide_range_in_a_small_quota(root: Path) -> None:
    (root / "quota").mkdir()
    service = job_service(f"sqlite:///{root / 'quota' / 'raydock.db'}", root / "quota")
    with service.sessions.begin() as s:
        quotas.set_quota(s, "wide", QuotaSpec(guaranteed_cpus=1, max_cpus=2))
        quotas.set_quota(s, "owner", QuotaSpec(guaranteed_cpus=4))
    job = submit(service, "wide", "wide", WIDE)
    plan, loads = admit(service, cluster(4))
    with service.sessions.begin() as s:
        queue.record_starts(s, plan)
    held = loads["wide"].cpus
    row("CPUs a 1..4096 range holds in a project of max_cpus 2", f"{held:g}", "<= 2", held <= 2)
    prepared = service.monitor.attempts.prepare(job)
    with storage.open_random_access(prepared.launch_uri) as f:
        launched = json.loads(f.read())["spec"]["scaling"]["num_workers"]["max"]
    row("max workers its driver hands Ray Train", str(launched), "<= 2", launched <= 2)
    borrowed = service.reads.get(job).borrowed
    row("borrowed beyond its 1-CPU guarantee", str(borrowed), "True", borrowed)
    set_columns(service, job, status="RUNNING", attempt=1, attempt_started_at=utcnow())
    submit(service, "owner", "owned", {"num_workers": 1, "cpus_per_worker": 3})
    plan, loads = admit(service, cluster(4))
    with service.sessions() as s:
        chosen = (
            fair_share.victims(quotas.running(s, ("RUNNING",)), loads, plan.wants[1], "owner") if plan.wants else []
        )
    row("preempted for another project's guaranteed 3-CPU job", str(chosen == [job]), "True", chosen == [job])
    service.sessions.kw["bind"].dispose()


def wide_range_without_a_quota(root: Path) -> None:
    (root / "free").mkdir()
    service = job_service(f"sqlite:///{root / 'free' / 'raydock.db'}", root / "free")
    submit(service, "free", "wide", WIDE)
    _, loads = admit(service, cluster(64))
    held = loads["free"].cpus
    row("CPUs a 1..4096 range holds with no quota, 64-CPU cluster", f"{held:g}", "<= 64", held <= 64)
    service.sessions.kw["bind"].dispose()


def many_wide_ranges(root: Path) -> None:
    (root / "many").mkdir()
    service = job_service(f"sqlite:///{root / 'many' / 'raydock.db'}", root / "many")
    projects = [f"p{i}" for i in range(10)]
    with service.sessions.begin() as s:
        for p in projects:
            quotas.set_quota(s, p, QuotaSpec(max_cpus=8))
    for i in range(200):
        submit(service, projects[i % 10], f"wide-{i}", WIDE)
    _, loads = admit(service, cluster(4096))
    most = max(loads[p].cpus for p in projects)
    total = sum(loads[p].cpus for p in projects)
    row("most CPUs a project holds, 200 ranges of 1..4096 in 10 projects (max_cpus 8)", f"{most:g}", "<= 8", most <= 8)
    row("CPUs held by them in all, 4,096-CPU cluster", f"{total:g}", "<= 80", total <= 80)
    service.sessions.kw["bind"].dispose()


def placement_group_names(root: Path) -> None:
    server = ServerProcess(root / "names", dead_ray()).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            taken = 0
            for name in PLACEMENT_GROUP_NAMES:
                body = digits_spec(scaling={"num_workers": 1, "resources_per_worker": {name: 1}})
                taken += http.post("/v1/jobs", json=body).status_code != 422
        forms = len(PLACEMENT_GROUP_NAMES)
        row(f"placement-group resource names a submit gets through, of {forms} forms", str(taken), "0", taken == 0)
    finally:
        server.stop()


def main() -> int:
    return run_attacks(
        "sched", wide_range_in_a_small_quota, wide_range_without_a_quota, many_wide_ranges, placement_group_names
    )


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
