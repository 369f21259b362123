"""Routes of a search's trials: the trials with their status, values and metrics, each
trial's metric series, the PBT lineage, the best trial and its replay as a training spec.
Thin: read the trial service."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import BestTrialPublic, ExploitPublic, TrainSpec, TrialMetricPoint, TrialPublic
from service.http.deps import JobId, Since, TrialId, Trials
from service.http.openapi import errors

router = APIRouter(tags=["trials"])


@router.get(
    "/jobs/{job_id}/trials",
    response_model=list[TrialPublic],
    operation_id="list_trials",
    responses=errors(404, 409, 422),
)
def list_trials(trials: Trials, job_id: JobId) -> list[TrialPublic]:
    """A search's trials: status, current values, reports, last and best metric, exploits."""
    return trials.trials(job_id)


@router.get(
    "/jobs/{job_id}/trials/{trial_id}/metrics",
    response_model=list[TrialMetricPoint],
    operation_id="get_trial_metrics",
    responses=errors(404, 409, 422),
)
def trial_metrics(trials: Trials, job_id: JobId, trial_id: TrialId, since: Since = -1) -> list[TrialMetricPoint]:
    """One trial's reports with seq > since, each with the values it trained with."""
    return trials.trial_metrics(job_id, trial_id, since)


@router.get(
    "/jobs/{job_id}/lineage",
    response_model=list[ExploitPublic],
    operation_id="get_lineage",
    responses=errors(404, 409, 422),
)
def lineage(trials: Trials, job_id: JobId) -> list[ExploitPublic]:
    """PBT's exploits in order: which trial cloned which, at which epoch or step, with which new values."""
    return trials.lineage(job_id)


@router.get(
    "/jobs/{job_id}/best",
    response_model=BestTrialPublic,
    operation_id="get_best_trial",
    responses=errors(404, 409, 422),
)
def best(trials: Trials, job_id: JobId) -> BestTrialPublic:
    """The best trial, its values and (once the search ended) its checkpoint; before, the best so far."""
    return trials.best(job_id)


@router.get(
    "/jobs/{job_id}/best/replay",
    response_model=TrainSpec,
    operation_id="get_best_trial_replay",
    responses=errors(404, 409, 422),
)
def replay(trials: Trials, job_id: JobId) -> TrainSpec:
    """A finished search's best trial as a `kind: train` spec: its first values, the search's budget and a
    `schedule` of the optimizer values it trained with in each interval (PBT's lineage). Submit it to reproduce the trial."""
    return trials.replay(job_id)
