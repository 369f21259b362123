"""Attacks on the events channel, as a job's code could make them, against a real
server (real HTTP, a real database, no Ray: jobs are put RUNNING in the store with an
events token the attacker holds). Shared by tests/test_event_bounds.py and
``python -m bench.abuse_events``, which print the same figures."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import insert

from api.schemas.events import SUBMISSION_HEADER
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.db.event_models import MetricRow, TrialMetricRow, TrialRow
from service.db.models import JobRow
from service.events.tokens import token_hash
from service.runtime import Runtime

TOKEN = "the-attackers-events-token"
SID = "raydock-attacked-1-abcdef"  # the Ray submission id of the attacked attempt (Ray's job list shows it)
SEARCH = {
    "kind": "tune",
    "name": "search-under-attack",
    "base": {k: v for k, v in digits_spec().items() if k not in ("name", "epochs", "checkpoint")},
    "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
    "algorithm": "random",
    "metric": "val_acc",
    "mode": "max",
    "num_trials": 4,
    "budget": {"epochs": 6},
}


@dataclass
class Target:
    server: ServerProcess
    service: Runtime  # the same store, in this process: jobs are put where an attack needs them

    @property
    def url(self) -> str:
        return self.server.url

    def running_job(self, **spec) -> str:
        """A job RUNNING on attempt 1 whose events token the attacker has."""
        job_id = submit(self.service, **spec)
        set_columns(
            self.service, job_id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN)
        )
        return job_id

    def running_search(self) -> str:
        from api.schemas import parse_job_spec

        job, _ = self.service.jobs.submit(parse_job_spec(SEARCH))
        set_columns(
            self.service, job.id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN)
        )
        return job.id

    def push(self, job_id: str, body, client: httpx.Client | None = None) -> httpx.Response:
        post = (client or httpx).post
        return post(
            f"{self.url}/v1/internal/jobs/{job_id}/events",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}", SUBMISSION_HEADER: SID},
            timeout=60,
        )

    def stop(self) -> None:
        self.server.stop()
        self.service.sessions.kw["bind"].dispose()


def start_target(data_dir: Path, database_url: str | None = None, **env: str) -> Target:
    url = database_url or f"sqlite:///{data_dir / 'raydock.db'}"
    extra = {"RAYDOCK_DATABASE_URL": url, **env}
    service = job_service(url, data_dir)  # migrates the store before the server opens it
    return Target(ServerProcess(data_dir, dead_ray(), extra_env=extra).start(), service)


# ------------------------------------------------------------------------------- M5


def flood_worker_failures(
    target: Target, job_id: str, n: int = 18_000, reason_chars: int = 2000, per_post: int = 400
) -> None:
    """``n`` distinct worker failures, each with a long reason, in posts under the body cap."""
    reason = "x" * reason_chars
    with httpx.Client() as client:
        for start in range(0, n, per_post):
            body = [
                {"type": "worker_failure", "seq": i, "ts": 1.0 + i, "reason": reason}
                for i in range(start, min(start + per_post, n))
            ]
            r = target.push(job_id, body, client)
            assert r.status_code == 204, r.text


def list_page_bytes(target: Target) -> int:
    r = httpx.get(f"{target.url}/v1/jobs", params={"limit": 50}, timeout=120)
    assert r.status_code == 200, r.text
    return len(r.content)


# ------------------------------------------------------------------------------- M6


def trial_reports(start: int, n: int, trials: int = 8) -> list[dict]:
    return [
        {
            "type": "trial_metric",
            "seq": i,
            "ts": 1.0 + i,
            "trial_id": f"t{i % trials}",
            "metrics": {"val_acc": ((i * 7919) % 10_007) / 10_007, "epoch": i // trials, "loss": 1.0 / (1 + i)},
            "config": {"optimizer.lr": 0.01 * (1 + i % trials)},
        }
        for i in range(start, start + n)
    ]


@dataclass
class PushFigures:
    submit_ms: list[float]
    pushes: int  # posts stored (204)
    busy: int  # posts turned away (429)
    other: dict[int, int]
    pushes_meanwhile: int  # posts stored from the first submit's start to the last one's answer

    @property
    def p50(self) -> float:
        return statistics.median(self.submit_ms)

    @property
    def max(self) -> float:
        return max(self.submit_ms)


def submits_while_a_search_pushes(
    target: Target, job_id: str, connections: int = 3, submits: int = 40, per_post: int = 200
) -> PushFigures:
    """``connections`` threads post batches of a search's reports for one job as fast as
    they can (ignoring 429: an attacker would), while ``submits`` jobs are submitted one
    after another; returns the submit latencies and what the posts got."""
    stop = threading.Event()
    lock = threading.Lock()
    got: dict[int, int] = {}
    counter = iter(range(0, 10**9, per_post))

    def pusher() -> None:
        with httpx.Client() as client:
            while not stop.is_set():
                with lock:
                    start = next(counter)
                status = target.push(job_id, trial_reports(start, per_post), client).status_code
                with lock:
                    got[status] = got.get(status, 0) + 1

    threads = [threading.Thread(target=pusher, daemon=True) for _ in range(connections)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the pushes are under way
    latencies: list[float] = []
    spec = digits_spec(name="submitted-meanwhile")
    with lock:
        stored_before = got.get(204, 0)
    with httpx.Client() as client:
        for _ in range(submits):
            t0 = time.perf_counter()
            r = client.post(f"{target.url}/v1/jobs", json=spec, timeout=60)
            latencies.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 202, r.text
    with lock:
        meanwhile = got.get(204, 0) - stored_before
    stop.set()
    for t in threads:
        t.join(120)
    other = {k: v for k, v in got.items() if k not in (204, 429)}
    return PushFigures(latencies, got.get(204, 0), got.get(429, 0), other, meanwhile)


# ------------------------------------------------------------------------------- M9


def seed_trial_reports(target: Target, job_id: str, n: int = 100_000, batch: int = 1000) -> None:
    """``n`` reports of a search, taken in by the server's own ingestion (in this
    process, on the same store), so the trials' best values are kept as in production."""
    for start in range(0, n, batch):
        target.service.ingest.take(job_id, trial_reports(start, min(batch, n - start), trials=50))


def best_by_reading_every_report(target: Target, job_id: str) -> tuple[str, float, dict]:
    """The best report as the endpoint answered before: the first of the best values, in storage order."""
    from sqlalchemy import select

    best = None
    with target.service.sessions() as s:
        for row in s.scalars(select(TrialMetricRow).where(TrialMetricRow.job_id == job_id).order_by(TrialMetricRow.id)):
            v = row.values.get("val_acc")
            if isinstance(v, (int, float)) and (best is None or v > best[1]):
                best = (row.trial_id, float(v), row.values)
    assert best is not None
    return best


def server_peak_rss_kib(target: Target) -> int:
    for line in Path(f"/proc/{target.server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def reset_peak_rss(target: Target) -> None:
    """Start the server's peak-memory mark from now (Linux: clear_refs 5)."""
    Path(f"/proc/{target.server.proc.pid}/clear_refs").write_text("5")


# ------------------------------------------------------------------------------- deletes


def seed_rows(target: Target, job_id: str, metrics: int, trial_reports_n: int = 0, chunk: int = 20_000) -> None:
    """Rows straight into the store (as a long job would have left them), fast."""
    with target.service.sessions.begin() as s:
        for start in range(0, metrics, chunk):
            rows = [
                {
                    "job_id": job_id,
                    "attempt": 1,
                    "src_seq": i,
                    "seq": i,
                    "ts": float(i),
                    "step": i,
                    "epoch": 0,
                    "values": {"loss": 1.0 / (1 + i)},
                }
                for i in range(start, min(start + chunk, metrics))
            ]
            s.execute(insert(MetricRow), rows)
        if trial_reports_n:
            s.add(
                TrialRow(
                    job_id=job_id, trial_id="t0", status="TERMINATED", config={}, reports=trial_reports_n, exploits=0
                )
            )
        for start in range(0, trial_reports_n, chunk):
            rows = [
                {
                    "job_id": job_id,
                    "attempt": 1,
                    "src_seq": i,
                    "trial_id": "t0",
                    "ts": float(i),
                    "values": {"val_acc": 0.5},
                    "config": {},
                }
                for i in range(start, min(start + chunk, trial_reports_n))
            ]
            s.execute(insert(TrialMetricRow), rows)
        s.get(JobRow, job_id).metrics_stored = metrics


def submit_latencies_while(target: Target, work, min_submits: int = 5) -> tuple[list[float], object, int]:
    """Submit jobs one after another while ``work()`` runs in a thread; the latencies, its
    result, and how many submits were answered before it had ended."""
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.setdefault("value", work()), daemon=True)
    latencies: list[float] = []
    meanwhile = 0
    spec = digits_spec(name="submitted-meanwhile")
    with httpx.Client() as client:
        worker.start()
        while worker.is_alive() or len(latencies) < min_submits:
            t0 = time.perf_counter()
            r = client.post(f"{target.url}/v1/jobs", json=spec, timeout=120)
            latencies.append((time.perf_counter() - t0) * 1000)
            meanwhile += worker.is_alive()
            assert r.status_code == 202, r.text
    worker.join()
    return latencies, result.get("value"), meanwhile


def exploit_chain(depth: int) -> list[dict]:
    """Trial t0 cloned t1, which had cloned t2 before, ... down to t<depth>: one clone per
    step back, the earliest decision first."""
    return [
        {
            "type": "exploit",
            "seq": depth - i,
            "trial_id": f"t{i}",
            "donor_trial_id": f"t{i + 1}",
            "donor_time": depth - i,
            "old_config": {"optimizer.lr": 0.01},
            "new_config": {"optimizer.lr": 0.01 + (depth - i) * 1e-6},
        }
        for i in range(depth)
    ][::-1]


def replay_of_a_lineage(target: Target, job_id: str, depth: int) -> httpx.Response:
    """Push a ``depth``-clone lineage for a running search, end it with t0 the best, and
    ask for its replay."""
    first = {"type": "trial", "seq": 0, "trial_id": f"t{depth}", "status": "RUNNING", "config": {"optimizer.lr": 0.01}}
    events = [first, *exploit_chain(depth)]
    for i in range(0, len(events), 200):
        r = target.push(job_id, events[i : i + 200])
        assert r.status_code == 204, r.text
    best = {"type": "best_trial", "seq": 0, "trial_id": "t0", "value": 0.9, "config": {"optimizer.lr": 0.013}}
    assert target.push(job_id, best).status_code == 204
    set_columns(target.service, job_id, status="SUCCEEDED")
    return httpx.get(f"{target.url}/v1/jobs/{job_id}/best/replay", timeout=120)
