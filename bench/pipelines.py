"""A three-step pipeline's overhead between steps, on a real cluster: a ``raydock serve``
over a Ray head of its own (or ``--ray-address``), three tiny one-worker steps in a row
(the second starting from the first's checkpoint, ``init_from``). For each step after the
first it measures, from the moment the previous step's Ray job ended (Ray's own end time):
when the server recorded that end, when the step joined the queue (the monitor's release
step), when it was admitted (its Ray job submitted), when its driver ran (RUNNING) and its
first metric. The pipeline's own overhead is the end -> admitted gap (target <= 2 s): what
comes after admission is the job's own start-up, the same for any job, shown beside it as
the first step's own admitted -> RUNNING -> first metric.

    python -m bench.pipelines [--ray-address URL] [--runs 1]

Measured here (2 shared cores): see the README's Pipelines section.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import datetime
from pathlib import Path

from ray.job_submission import JobSubmissionClient

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import start_head

TARGET_S = 2.0
TINY = {"epochs": 1, "scaling": {"num_workers": 1, "cpus_per_worker": 0.5}}


def _at(iso) -> float:
    return iso.timestamp() if isinstance(iso, datetime) else datetime.fromisoformat(iso).timestamp()


def moments(sdk: Client, job_id: str) -> dict[str, float]:
    """Unix times of a job's queueing (its last move to QUEUED), admission, RUNNING and first metric."""
    out: dict[str, float] = {}
    for e in sdk.job(job_id).events():
        if e.type == "status_changed" and e.data.get("to") == "QUEUED":
            out["queued"] = _at(e.at)
        elif e.type == "admitted":
            out["admitted"] = _at(e.at)
        elif e.type == "status_changed" and e.data.get("to") == "RUNNING" and "running" not in out:
            out["running"] = _at(e.at)
    info = sdk.job(job_id).info
    out.setdefault("queued", _at(info.created_at))
    phases = info.start_phases or {}
    if "first_metric" in phases:
        out["first_metric"] = out["queued"] + phases["first_metric"]
    out["recorded_end"] = _at(info.finished_at) if info.finished_at else float("nan")
    out["ray_id"] = info.ray_job_id
    return out


def run_once(sdk: Client, ray: JobSubmissionClient) -> list[dict[str, float]]:
    made = sdk.submit_pipeline(
        {
            "name": "bench-three",
            "steps": [
                {"name": "one", "job": digits_spec(name="one", **TINY)},
                {"name": "two", "job": digits_spec(name="two", **{**TINY, "epochs": 2}), "init_from": {"step": "one"}},
                {"name": "three", "job": digits_spec(name="three", **TINY), "after": [{"step": "two"}]},
            ],
        }
    )
    done = sdk.wait_pipeline(made.id, timeout=900, poll_s=2.0)
    if done.status.value != "SUCCEEDED":
        raise SystemExit(f"the pipeline ended {done.status.value}: {[(s.name, s.status_reason) for s in done.steps]}")
    steps = [moments(sdk, s.job_id) for s in done.steps]
    for m in steps:
        m["ray_end"] = ray.get_job_info(m["ray_id"]).end_time / 1000.0
    gaps = []
    for prev, nxt in zip(steps, steps[1:]):
        end = prev["ray_end"]
        gaps.append({k: nxt[k] - end for k in ("queued", "admitted", "running", "first_metric") if k in nxt})
        gaps[-1]["recorded_end"] = prev["recorded_end"] - end
    gaps.append({"own_running": steps[0]["running"] - steps[0]["admitted"]})
    gaps[-1]["own_first_metric"] = steps[0].get("first_metric", float("nan")) - steps[0]["admitted"]
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray-address", default=None, help="default: a Ray head of the bench's own (2 CPUs)")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raydock-bench-pipelines-") as tmp:
        head = None if args.ray_address else start_head(Path(tmp) / "ray", num_cpus=2)
        address = args.ray_address or head.dashboard_url
        server = ServerProcess(Path(tmp) / "server", address).start()
        try:
            with Client(server.url) as sdk:
                ray = JobSubmissionClient(address, headers=head.headers if head is not None else None)
                runs = [run_once(sdk, ray) for _ in range(args.runs)]
        finally:
            server.stop()
            if head is not None:
                head.stop()
    worst = 0.0
    for r, gaps in enumerate(runs, 1):
        for i, g in enumerate(gaps[:-1], 2):
            worst = max(worst, g["admitted"])
            print(
                f"run {r} step {i}: after the previous step's Ray job ended: end recorded +{g['recorded_end']:.2f} s, "
                f"queued +{g['queued']:.2f} s, admitted +{g['admitted']:.2f} s, RUNNING +{g.get('running', float('nan')):.2f} s, "
                f"first metric +{g.get('first_metric', float('nan')):.2f} s"
            )
        own = gaps[-1]
        print(
            f"run {r} step 1's own start-up (any job's): admitted -> RUNNING {own['own_running']:.2f} s, "
            f"-> first metric {own['own_first_metric']:.2f} s"
        )
    print(
        f"overhead between steps (previous end -> next admitted), worst {worst:.2f} s | target <= {TARGET_S:g} s | "
        f"{'ok' if worst <= TARGET_S else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
