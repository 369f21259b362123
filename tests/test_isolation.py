"""A job can only touch its own record: hostile events, forged checkpoint paths, faults
between the Ray submit and the database write, a cancel during a submit, a cluster that
goes away and comes back. Real server, real Ray, real database; each test asserts the
outcome (what the job record says, what Ray runs)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import httpx
import pytest
from ray.job_submission import JobSubmissionClient
from sqlalchemy import create_engine, text

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for
from service.cluster.local_cluster import free_ports
from tests.support.specs import user_spec

ONE = {"num_workers": 1}
POISON = [
    '{"type":"metric","seq":"x","metrics":{}}',
    '{"type":"metric","seq":0,"metrics":[1]}',
    '{"type":"metric","seq":%d,"metrics":{}}' % 2**70,
    '{"type":"error","seq":0,"cause":"BOGUS","message":"m"}',
    '{"type":"error","seq":0,"cause":"TIMEOUT","message":"m"}',
    '{"type":"worker_group","seq":0,"world_size":1,"nodes":"ab"}',
]


def hostile(lines: list[str], **config) -> dict:
    return {**user_spec("userpkg.hostile:train", name="hostile", config={"lines": lines, **config}), "scaling": ONE}


def ray_jobs_of(dashboard: str, job_id: str) -> list:
    return [j for j in JobSubmissionClient(dashboard).list_jobs() if (j.metadata or {}).get("raydock_job") == job_id]


def active(jobs: list) -> list:
    return [
        j for j in jobs if str(j.status.value if hasattr(j.status, "value") else j.status) in ("PENDING", "RUNNING")
    ]


def test_poison_events_are_dropped_and_counted_and_the_server_goes_on(client: Client, server, ray_head):
    bad = client.submit(hostile(POISON, steps=10_000, sleep_s=0.5))
    wait_for(lambda: bad.refresh().info.dropped_events >= len(POISON), 180, "poison events counted")
    assert bad.info.last_dropped_reason
    assert bad.status.value in ("STARTING", "RUNNING")

    # The queue and the other jobs go on.
    good = client.submit({**user_spec("userpkg.steps:train", name="good", config={"steps": 2}), "scaling": ONE})
    good.wait(timeout=180)
    assert good.status.value == "SUCCEEDED", good.info.error
    assert good.info.dropped_events == 0
    # Its driver and its Train controller pushed with the attempt's token and submission id.
    log = (Path(server.data_dir) / "server.log").read_text(errors="replace").splitlines()
    pushes = [line for line in log if f"/v1/internal/jobs/{good.id}/events" in line]
    assert pushes and all(" 204" in line or " 429" in line for line in pushes), pushes[:5]

    bad.cancel()
    wait_for(lambda: bad.refresh().status.value == "CANCELLED", 90, "poisoned job cancelled")
    assert bad.info.failure_cause is None

    # The token reached the driver in a file under the job's own prefix, not in Ray's job
    # list, and the driver deleted it once read: another job on the cluster finds nothing there.
    launch_dir = Path(server.data_dir) / "storage" / bad.id / "_raydock"
    assert launch_dir.is_dir() and not (launch_dir / "launch-1.json").exists()
    (ray_job,) = ray_jobs_of(ray_head.dashboard_url, bad.id)
    assert "events_token" not in json.dumps(ray_job.runtime_env or {})
    assert ray_job.submission_id.startswith(f"raydock-{bad.id}-1-")
    # An ended job takes no more events.
    before = len(bad.metrics())
    late = {"type": "metric", "seq": before, "metrics": {"step": 99}}
    r = httpx.post(
        f"{server.url}/v1/internal/jobs/{bad.id}/events",
        json=late,
        headers={"Authorization": "Bearer guessed", "Raydock-Submission-Id": ray_job.submission_id},
    )
    assert r.status_code == 401
    assert len(bad.metrics()) == before


def test_forged_checkpoint_paths_are_neither_listed_nor_downloadable(client: Client, server):
    data_dir = Path(server.data_dir).resolve()
    forged = [
        str(data_dir),  # the server's own data: its database holds every job's record
        "/etc",
        f"{data_dir}/storage/JOBID/../jother",  # escapes with ..
        "s3://bucket/anything",
    ]
    lines = [json.dumps({"type": "checkpoint", "seq": i, "path": p, "metrics": {}}) for i, p in enumerate(forged)]
    # A spec far over the environment's size limit reaches the driver (in its launch file).
    job = client.submit(hostile(lines, steps=2, blob="x" * 200_000))
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    # Every forged line the job's log holds is dropped (Ray may write a worker's line twice).
    forged_lines = [line for line in job.logs().splitlines() if 'RAYDOCK_EVENT {"type": "checkpoint"' in line]
    assert len(forged_lines) >= len(forged)
    assert job.info.dropped_events == len(forged_lines)
    assert job.checkpoints() == []

    # A row that names a foreign path (as an older server may have stored) is checked again at download.
    engine = create_engine(f"sqlite:///{data_dir / 'raydock.db'}")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO checkpoints (job_id, attempt, path, \"values\", created_at) VALUES (:j, 1, :p, '{}', CURRENT_TIMESTAMP)"
            ),
            {"j": job.id, "p": str(data_dir)},
        )
        row_id = conn.execute(text("SELECT max(id) FROM checkpoints WHERE job_id = :j"), {"j": job.id}).scalar()
    engine.dispose()
    assert job.checkpoints() == []
    r = httpx.get(f"{server.url}/v1/jobs/{job.id}/checkpoints/{row_id}/download")
    assert r.status_code == 404, r.text


def test_a_job_the_monitor_cannot_follow_fails_alone(client: Client, server, ray_head):
    bad = client.submit(hostile([], steps=10_000, sleep_s=0.5))
    wait_for(lambda: bad.metrics(), 180, "first report")
    # A column the follow reads turns unreadable to this server (as one written by another
    # version may): every follow of this job raises, and only this job's.
    engine = create_engine(f"sqlite:///{Path(server.data_dir).resolve() / 'raydock.db'}")
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET max_runtime_s = 'soon' WHERE id = :j"), {"j": bad.id})
    engine.dispose()

    good = client.submit({**user_spec("userpkg.steps:train", name="good", config={"steps": 2}), "scaling": ONE})
    good.wait(timeout=180)
    assert good.status.value == "SUCCEEDED", good.info.error
    wait_for(lambda: bad.refresh().status.value == "FAILED", 60, "the unfollowable job to fail")
    assert bad.info.failure_cause.value == "INFRASTRUCTURE"
    assert "could not follow" in bad.info.status_reason
    wait_for(lambda: not active(ray_jobs_of(ray_head.dashboard_url, bad.id)), 60, "its Ray job stopped")


@pytest.fixture(scope="module")
def faulty_server(ray_head, tmp_path_factory):
    # Every submit waits 4 s after Ray accepted it, then fails once per job before the
    # database write: the retry must find the same Ray job, not make a second one.
    env = {"RAYDOCK_TEST_FAULTS": "delay_after_submit=4,fail_after_submit"}
    srv = ServerProcess(tmp_path_factory.mktemp("faulty"), ray_head.dashboard_url, extra_env=env).start()
    yield srv
    srv.stop()


def test_failure_between_ray_submit_and_db_write_makes_one_ray_job(faulty_server, ray_head):
    with Client(faulty_server.url) as c:
        job = c.submit({**user_spec("userpkg.steps:train", name="fault", config={"steps": 2}), "scaling": ONE})
        job.wait(timeout=240)
        assert job.status.value == "SUCCEEDED", job.info.error
        assert job.info.attempt == 1
    assert len(ray_jobs_of(ray_head.dashboard_url, job.id)) == 1


def test_cancel_during_submit_leaves_one_ray_job_stopped(faulty_server, ray_head):
    with Client(faulty_server.url) as c:
        job = c.submit(hostile([], steps=10_000, sleep_s=0.5))
        wait_for(lambda: ray_jobs_of(ray_head.dashboard_url, job.id), 60, "Ray to accept the submit")
        assert job.refresh().status.value == "QUEUED"  # the database write has not happened yet
        job.cancel()
        assert job.status.value == "CANCELLED"
        wait_for(lambda: not active(ray_jobs_of(ray_head.dashboard_url, job.id)), 90, "the Ray job stopped")
        assert len(ray_jobs_of(ray_head.dashboard_url, job.id)) == 1
        assert job.refresh().status.value == "CANCELLED"


class Proxy:
    """A TCP forwarder to the dashboard that can be cut (refusing and dropping every
    connection) and restored: the cluster goes away and comes back."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.up = threading.Event()
        self.conns: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.2)
        self.closed = False
        self.up.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            if not self.up.is_set():
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                conn.close()
                continue
            self.conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.up.clear()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()


def test_cluster_lost_and_back_then_resume_runs_one_driver(ray_head, tmp_path):
    proxy = Proxy(ray_head.dashboard_url)
    env = {"RAYDOCK_CLUSTER_LOST_AFTER_S": "3"}
    srv = ServerProcess(tmp_path / "srv", proxy.url, extra_env=env).start()
    try:
        with Client(srv.url) as c:
            job = c.submit(hostile([], steps=10_000, sleep_s=0.5))
            wait_for(lambda: job.metrics(), 180, "first report")
            proxy.cut()
            wait_for(lambda: job.refresh().status.value == "FAILED", 60, "the job to fail for cluster loss")
            assert job.info.failure_cause.value == "INFRASTRUCTURE"
            assert "unreachable" in job.info.status_reason
            assert active(ray_jobs_of(ray_head.dashboard_url, job.id))  # it trains on, untracked for now

            # Submitted while Ray does not answer, so unchecked at submit: it must not block the queue.
            huge = c.submit({**user_spec("userpkg.steps:train", name="huge"), "scaling": {"num_workers": 64}})
            assert huge.status.value == "QUEUED"

            proxy.restore()
            wait_for(
                lambda: not active(ray_jobs_of(ray_head.dashboard_url, job.id)), 90, "the orphaned Ray job stopped"
            )
            wait_for(lambda: huge.refresh().status.value == "FAILED", 60, "the job that can never fit to fail")
            assert huge.info.failure_cause.value == "NO_RESOURCES"
            assert "64 workers" in huge.info.error

            job.resume()
            wait_for(lambda: [p for p in job.metrics() if p.attempt == 2], 180, "the second attempt reporting")
            running = active(ray_jobs_of(ray_head.dashboard_url, job.id))
            assert len(running) == 1 and running[0].submission_id.startswith(f"raydock-{job.id}-2-")
            job.cancel()
            wait_for(lambda: job.refresh().status.value == "CANCELLED", 90, "cancel")
    finally:
        srv.stop()
        proxy.close()


def test_idempotency_key_with_a_different_body_is_refused(tmp_path):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # no cluster: jobs stay QUEUED, nothing trains
    srv = ServerProcess(tmp_path / "srv", dead).start()
    try:
        spec = user_spec("userpkg.steps:train", name="keyed")
        first = httpx.post(f"{srv.url}/v1/jobs", json=spec, headers={"Idempotency-Key": "k-1"})
        again = httpx.post(f"{srv.url}/v1/jobs", json=spec, headers={"Idempotency-Key": "k-1"})
        other = httpx.post(f"{srv.url}/v1/jobs", json={**spec, "name": "other"}, headers={"Idempotency-Key": "k-1"})
        assert (first.status_code, again.status_code) == (202, 200)
        assert again.json()["id"] == first.json()["id"]
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "idempotency_key_reused"
    finally:
        srv.stop()
