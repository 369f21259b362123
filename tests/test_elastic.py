"""Elastic jobs (``scaling.num_workers: {min, max}``) on the session cluster: the spec's
checks, and a job admitted by its ``min`` that grows when another job's CPUs free up,
resuming from its checkpoint, with the worker count in its metrics and worker groups."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import user_spec


def elastic(lo: int, hi: int, **scaling) -> dict:
    return {"num_workers": {"min": lo, "max": hi}, **scaling}


CASES = [
    ("min above max", digits_spec(scaling=elastic(3, 2)), "invalid_spec", "min (3) must be <= max (2)"),
    (
        "min below one",
        digits_spec(scaling=elastic(0, 2)),
        "invalid_spec",
        "min: Input should be greater than or equal to 1",
    ),
    ("range without max", digits_spec(scaling={"num_workers": {"min": 1}}), "invalid_spec", "max: Field required"),
    (
        "range with a fixed mesh",
        digits_spec(scaling=elastic(1, 2), parallelism={"strategy": "parameter_server"}),
        "invalid_spec",
        "needs a strategy whose mesh is data-parallel only",
    ),
    (
        "range for the gpt",
        {"model": {"type": "gpt"}, "scaling": elastic(1, 2)},
        "invalid_spec",
        "not available for model.type gpt",
    ),
    (
        "min above the cluster",
        digits_spec(scaling=elastic(CLUSTER_CPUS + 1, CLUSTER_CPUS + 2)),
        "exceeds_cluster_capacity",
        "(scaling.num_workers.min)",
    ),
]


@pytest.mark.parametrize("what,body,code,hint", CASES, ids=[c[0] for c in CASES])
def test_bad_elastic_spec_is_refused(server, what, body, code, hint):
    r = httpx.post(server.url + "/v1/jobs", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == code
    assert hint in r.json()["error"]["message"]


@pytest.mark.long  # about 2 minutes on 2 cores (a resize and a resume): RAYDOCK_LONG_TESTS=1
def test_elastic_job_grows_when_cpus_free_up_and_resumes_from_checkpoint(server):
    http = httpx.Client(base_url=server.url, timeout=30)

    def status(job_id: str) -> str:
        return http.get(f"/v1/jobs/{job_id}").json()["status"]

    # Holds 2 of the 4 CPUs until cancelled. Ray Train shares the cluster between runs
    # in start order, so the elastic job starts on the 2 left and grows at its first
    # resize check after the blocker's CPUs are free: to 4, all there is: its max of 8
    # is granted as 4, the cluster's size (admission starts it by its min).
    # Whatever fails, both jobs are cancelled at the test's teardown (tests/support/cluster_teardown.py).
    blocker = http.post(
        "/v1/jobs", json=user_spec("userpkg.steps:train", name="blocker", config={"steps": 100_000, "sleep_s": 0.2})
    ).json()["id"]
    wait_for(lambda: http.get(f"/v1/jobs/{blocker}/metrics").json(), 120, "the blocker to train")
    spec = digits_spec(
        name="grows", epochs=100_000, batch_size=32, scaling=elastic(1, CLUSTER_CPUS * 2, resize_check_interval_s=3)
    )
    r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.json()["spec"]["scaling"]["num_workers"] == {"min": 1, "max": CLUSTER_CPUS * 2}
    # A lost node shrinks an elastic job instead of failing it.
    assert r.json()["spec"]["failure"]["max_retries"] == 3

    def sizes() -> list[int]:
        return [g["world_size"] for g in http.get(f"/v1/jobs/{job_id}/worker-groups").json()]

    def world_sizes() -> list[int]:
        return [p["metrics"]["world_size"] for p in http.get(f"/v1/jobs/{job_id}/metrics").json()]

    wait_for(lambda: 2 in world_sizes(), 180, "the job to train on the 2 free CPUs")
    http.post(f"/v1/jobs/{blocker}/cancel")
    wait_for(lambda: world_sizes().count(CLUSTER_CPUS) >= 2, 180, "reports from 4 workers")
    http.post(f"/v1/jobs/{job_id}/cancel")
    wait_for(lambda: status(job_id) == "CANCELLED" and status(blocker) == "CANCELLED", 120, "both jobs to stop")
    assert sizes() == [2, CLUSTER_CPUS]
    series = http.get(f"/v1/jobs/{job_id}/metrics").json()
    world = [p["metrics"]["world_size"] for p in series]
    assert world[0] == 2 and world == sorted(world)
    epochs = [p["epoch"] for p in series]
    # The grown group resumed from the last checkpoint: no epoch went back to the start.
    assert epochs.count(1) == 1 and epochs[-1] > epochs[world.index(CLUSTER_CPUS) - 1]
