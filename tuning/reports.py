"""What a trial's trainable does with each report of its loop, on either path (a Ray Train
run's, ``tuning.trial``, or local ranks', ``tuning.trial_ranks``)."""

from __future__ import annotations

from typing import Any

from ray import tune

from api.schemas import REPORTS_UNIT, TuneSpec
from tuning.population import Alignment

REPORTS_KEY = "raydock_reports"


class TrialReports:
    """What the trainable does with each report of its loop, on either path: check it,
    count it (Tune's count goes on from the checkpoint the trial starts from; each
    checkpoint carries the count it was reported at), hand it to Tune with its
    checkpoint, then wait at a perturbation point with the population."""

    def __init__(self, search: TuneSpec, trial_id: str, start, population, should_stop=None) -> None:
        self.metric, self.unit = search.metric, search.unit
        self.count = int((start.get_metadata() if start is not None else {}).get(REPORTS_KEY, 0))
        self.align = None
        if population is not None:
            interval, budget = search.pbt.perturbation_interval, search.budget_amount
            self.align = Alignment(population, trial_id, interval, budget, should_stop)

    def forward(self, metrics: dict[str, Any], checkpoint) -> None:
        _check_report(metrics, self.metric, self.unit)
        self.count += 1
        checkpoint = tune_checkpoint(checkpoint)
        if checkpoint is not None:
            checkpoint.set_metadata({REPORTS_KEY: self.count})
        tune.report(metrics, checkpoint=checkpoint)
        if self.align is not None:
            self.align.after_report(self.count if self.unit == REPORTS_UNIT else metrics[self.unit])


def tune_checkpoint(checkpoint: Any) -> Any:
    """``checkpoint`` (Ray Train's class, or Tune's) as a Tune checkpoint of the same files."""
    return None if checkpoint is None else tune.Checkpoint(path=checkpoint.path, filesystem=checkpoint.filesystem)


def _check_report(metrics: dict[str, Any], metric: str, unit: str) -> None:
    missing = [k for k in (metric, unit) if k not in metrics and k != REPORTS_UNIT]
    if missing:
        raise ValueError(
            f"the trial's loop reported {sorted(metrics)} without {' and '.join(repr(k) for k in missing)}. "
            f"A search needs its metric and its budget unit ({unit!r}) in every ray.train.report; "
            "report them, or change `metric` / `budget`."
        )
