"""Where the start-up of a small raydock job goes, phase by phase, cold and warm.

    .venv/bin/python -m bench.job_timeline                 # 1 cold + 3 warm jobs of each kind
    .venv/bin/python -m bench.job_timeline --warm 5 --kinds builtin

For each kind of job (a built-in model, and user code), starts a fresh Ray head and
server, runs one job on it (cold: the first job on a fresh cluster), then ``--warm``
more (warm: jobs have run before), and prints the job's ``start_phases`` from
``GET /v1/jobs/{id}`` (seconds after POST: queued, admitted, submitted, driver_started,
workers_placed, process_group_ready, first_step, first_metric) as ``phase | cold | warm``
(warm: the median), then POST -> first metric against the 5 s target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

from api.schemas.events import PHASE_NAMES
from bench.harness.servers import ServerProcess
from bench.jobs import run_job
from service.cluster.local_cluster import start_head

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "usercode"
TARGET_S = 5.0

# Two workers, a few steps: the job is all start-up.
SPECS = {
    "builtin": {
        "name": "timeline-builtin",
        "model": {"type": "mlp", "hidden_sizes": [64]},
        "data": {"source": "digits"},
        "max_steps": 5,
        "scaling": {"num_workers": 2},
    },
    "user": {
        "name": "timeline-user",
        "entrypoint": "userpkg.steps:train",
        "working_dir": str(FIXTURES),
        "config": {"steps": 5},
        "scaling": {"num_workers": 2},
    },
}


def run_kind(kind: str, warm: int) -> tuple[dict, list[dict], list[float]]:
    """The cold job's phases, each warm job's, and every job's POST -> first metric as
    the client saw it (polling), on a cluster of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        server = ServerProcess(Path(tmp) / "server", head.dashboard_url).start()
        try:
            http = httpx.Client(base_url=server.url, timeout=30)
            runs = []
            for i in range(1 + warm):
                run = run_job(http, SPECS[kind])
                runs.append(run)
                print(f"  {kind} job {i + 1}/{1 + warm}: {json.dumps(run.job['start_phases'])}", flush=True)
        finally:
            server.stop()
            head.stop()
    phases = [r.job["start_phases"] or {} for r in runs]
    return phases[0], phases[1:], [r.first_metric_s for r in runs]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cell(value: float | None) -> str:
    return f"{value:7.2f}" if value is not None else f"{'-':>7}"


def table(kind: str, cold: dict, warm: list[dict]) -> list[str]:
    lines = [f"\n{kind}: phase (s after POST) | cold | warm (median of {len(warm)})"]
    for name in PHASE_NAMES:
        w = median([p[name] for p in warm if name in p])
        lines.append(f"  {name:22} {cell(cold.get(name))} {cell(w)}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=int, default=3, help="warm jobs per kind (their median is shown)")
    ap.add_argument("--kinds", default="builtin,user", help="comma-separated: builtin, user")
    args = ap.parse_args()
    out, summary = [], {}
    for kind in args.kinds.split(","):
        print(f"{kind}: a fresh cluster, 1 cold + {args.warm} warm jobs...", flush=True)
        cold, warm, seen = run_kind(kind, args.warm)
        out += table(kind, cold, warm)
        summary[kind] = {
            "cold": cold,
            "warm": warm,
            "first_metric_cold_s": cold.get("first_metric"),
            "first_metric_warm_median_s": median([p["first_metric"] for p in warm if "first_metric" in p]),
            "client_first_metric_s": seen,
        }
    print("\n".join(out))
    print(f"\nPOST -> first metric (the first_metric phase), target <= {TARGET_S:.0f} s warm:")
    for kind, s in summary.items():
        w = s["first_metric_warm_median_s"]
        verdict = "-" if w is None else ("meets" if w <= TARGET_S else f"{w / TARGET_S:.1f}x over")
        print(f"  {kind:8} cold {cell(s['first_metric_cold_s'])}   warm {cell(w)}   {verdict}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
