"""Two tiny Tune searches, run as a Ray job, each with the search driver's stall guard
(``tuning.stall.StallGuard``, limit ``argv[1]`` seconds): ``healthy`` runs two trials
whose every step takes twice the limit; ``stalls`` runs two trials under a scheduler that
pauses every trial at its first report and never starts a paused one (nothing runs, the
cluster has room). Prints one JSON line, per search its outcome (``stalled`` with the
guard's reason, or ``finished`` with each trial's last step) and the seconds from its
last trial report to its end."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import ray
from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from tuning.stall import SearchStalled, StallGuard


class PausesEveryTrial(FIFOScheduler):
    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return TrialScheduler.PAUSE

    def choose_trial_to_run(self, tune_controller):
        return next((t for t in tune_controller.get_trials() if t.status == "PENDING"), None)


def steps(config: dict) -> None:
    for step in range(1, config["steps"] + 1):
        time.sleep(config["sleep_s"])
        tune.report({"loss": 1.0 / step, "step": step})


class LastReport(tune.Callback):
    at = 0.0

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        LastReport.at = time.monotonic()


def search(mode: str, limit: float) -> dict:
    stalls = mode == "stalls"
    config = {"steps": 2, "sleep_s": 0.0 if stalls else limit * 2}
    tuner = tune.Tuner(
        tune.with_resources(steps, {"cpu": 0.1}),
        param_space=config,
        tune_config=tune.TuneConfig(
            num_samples=2, metric="loss", mode="min", scheduler=PausesEveryTrial() if stalls else None
        ),
        run_config=tune.RunConfig(
            storage_path=tempfile.mkdtemp(prefix="raydock-stall-"),
            callbacks=[LastReport(), StallGuard(limit)],
            verbose=0,
        ),
    )
    try:
        results = tuner.fit()
    except SearchStalled as stalled:
        out = {"outcome": "stalled", "reason": str(stalled)}
    else:
        out = {"outcome": "finished", "steps": sorted(r.metrics.get("step", 0) for r in results)}
    out["after_last_report_s"] = time.monotonic() - LastReport.at
    return out


def main() -> None:
    limit = float(sys.argv[1])
    ray.init(log_to_driver=False, configure_logging=False)  # the cluster of the Ray job this runs as
    out = {mode: search(mode, limit) for mode in ("healthy", "stalls")}
    print("STALL_SEARCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
