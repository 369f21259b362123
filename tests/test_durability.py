"""Durability: worker failures retry from checkpoint, the queue admits in order, no
POST is lost or doubled, resume continues from the checkpoint, deadlines fail jobs
with the right reason."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for
from service.cluster.local_cluster import free_ports
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import user_spec


def ckpt_job(**config) -> dict:
    return user_spec(
        "userpkg.ckpt_steps:train", name="ckpt", config={"steps": 20, "every": 5, "sleep_s": 0.3, **config}
    )


def test_worker_sigkill_retries_from_last_checkpoint(client: Client):
    job = client.submit({**ckpt_job(), "failure": {"max_retries": 1}})
    first = wait_for(lambda: [p for p in job.metrics() if p.metrics["step"] >= 7], 120, "step 7")[0]
    os.kill(first.metrics["pid"], signal.SIGKILL)  # rank 0's training worker

    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    steps = [p.metrics["step"] for p in job.metrics()]
    assert steps[-1] == 20
    # After the failure training continued at the step after a checkpoint, not from step 1.
    restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    resumed = job.metrics()[restart].metrics
    assert resumed["resumed_from"] in (5, 10) and steps[restart] == resumed["resumed_from"] + 1
    assert resumed["pid"] != first.metrics["pid"]
    assert len(job.info.restarts) == 1
    assert "rank 0" in job.info.restarts[0].reason


def test_resume_after_cancel_continues_from_checkpoint(client: Client):
    job = client.submit(ckpt_job(steps=14))
    wait_for(lambda: any(p.metrics["step"] >= 7 for p in job.metrics()), 120, "step 7")
    job.cancel()
    wait_for(lambda: job.refresh().status.value == "CANCELLED", 60, "cancel")
    last_checkpoint = max(c.step for c in job.checkpoints())
    assert last_checkpoint >= 5

    job.resume()
    assert job.status.value == "QUEUED" and "checkpoint" in job.info.status_reason
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert job.info.attempt == 2
    second = [p for p in job.metrics() if p.attempt == 2]
    assert second[0].metrics["step"] == last_checkpoint + 1
    assert second[-1].metrics["step"] == 14
    # Both attempts' logs are kept.
    assert job.logs().count("Running entrypoint for job") == 2


def test_queue_admits_by_priority_then_arrival_and_enforces_deadlines(client: Client):
    blocker = client.submit(
        {
            **ckpt_job(steps=10_000, sleep_s=0.2),
            "name": "blocker",
            "scaling": {"num_workers": 2, "cpus_per_worker": CLUSTER_CPUS / 2},
        }
    )
    wait_for(lambda: blocker.metrics(), 120, "blocker running")
    small = {"steps": 1, "sleep_s": 0.0}
    one_node = {"num_workers": 1, "cpus_per_worker": CLUSTER_CPUS - 1}  # one at a time
    a = client.submit({**user_spec("userpkg.steps:train", name="a", config=small), "scaling": one_node})
    b = client.submit({**user_spec("userpkg.steps:train", name="b", config=small), "scaling": one_node, "priority": 5})
    c = client.submit({**user_spec("userpkg.steps:train", name="c", config=small), "scaling": one_node})
    late = client.submit(
        {**user_spec("userpkg.steps:train", name="late", config=small), "scaling": one_node, "scheduling_timeout_s": 2}
    )

    wait_for(lambda: late.refresh().status.is_terminal(), 30, "scheduling deadline")
    assert late.status.value == "FAILED" and late.info.failure_cause.value == "NO_RESOURCES"
    assert "scheduling_timeout_s" in late.info.error
    assert [j.refresh().info.queue_position for j in (b, a, c)] == [1, 2, 3]
    assert "waiting for resources" in a.info.status_reason

    blocker.cancel()
    for j in (a, b, c):
        j.wait(timeout=240)
        assert j.status.value == "SUCCEEDED", j.info.error
    assert b.info.started_at < a.info.started_at < c.info.started_at


def test_max_runtime_fails_with_timeout(client: Client):
    job = client.submit({**ckpt_job(steps=10_000, sleep_s=0.2), "max_runtime_s": 3})
    job.wait(timeout=120)
    assert job.status.value == "FAILED"
    assert job.info.failure_cause.value == "TIMEOUT"
    assert "max_runtime_s=3" in job.info.error
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 60, "CPUs released")

    # max_runtime_s counts per attempt: a resumed job gets its own 3 s, not none.
    job.resume()
    wait_for(lambda: job.refresh().status.value == "RUNNING", 120, "the second attempt running")
    seen = set()
    deadline = time.monotonic() + 1.5  # well inside its own 3 s; the first attempt's are long spent
    while time.monotonic() < deadline:
        seen.add(job.refresh().status.value)
        time.sleep(0.1)
    assert seen == {"RUNNING"}
    job.wait(timeout=120)
    assert job.status.value == "FAILED" and job.info.failure_cause.value == "TIMEOUT" and job.info.attempt == 2
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 60, "CPUs released")


def test_concurrent_posts_are_all_recorded_once(tmp_path):
    # A server with no reachable cluster: every job stays QUEUED, so 200 POSTs cost no training.
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    srv = ServerProcess(tmp_path / "srv", dead).start()
    try:
        http = httpx.Client(base_url=srv.url, timeout=60, limits=httpx.Limits(max_connections=32))
        spec = user_spec("userpkg.steps:train", labels={"batch": "b200"})

        def post(i: int) -> str:
            return http.post("/v1/jobs", json={**spec, "name": f"c{i}"}).raise_for_status().json()["id"]

        with ThreadPoolExecutor(32) as pool:
            ids = list(pool.map(post, range(200)))
        assert len(set(ids)) == 200
        listed = http.get("/v1/jobs", params={"label": "batch=b200", "limit": 1000}).json()
        assert listed["total"] == 200 and {j["id"] for j in listed["items"]} == set(ids)

        # Retries with one Idempotency-Key, even racing each other, make one job.
        barrier = threading.Barrier(16)

        def keyed(_: int) -> tuple[int, str]:
            barrier.wait()
            r = http.post("/v1/jobs", json={**spec, "name": "keyed"}, headers={"Idempotency-Key": "retry-me-1"})
            return r.status_code, r.json()["id"]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(keyed, range(16)))
        assert len({job_id for _, job_id in answers}) == 1
        assert sorted(code for code, _ in answers) == [200] * 15 + [202]
        assert http.get("/v1/jobs", params={"label": "batch=b200", "limit": 1000}).json()["total"] == 201
    finally:
        srv.stop()
