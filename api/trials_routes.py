"""Routes of a search's trials: the trials with their status, values and metrics, each
trial's metric series, the PBT lineage and the best trial. ``api.app`` mounts
``router`` under its authenticated ``/v1`` router. Thin, like every route: read the
trial service and return its public models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from api.schemas import BestTrialPublic, ExploitPublic, TrialMetricPoint, TrialPublic
from service.trials import TrialService


def trial_service(request: Request) -> TrialService:
    return TrialService(request.app.state.runtime.service.sessions)


Trials = Annotated[TrialService, Depends(trial_service)]
router = APIRouter(tags=["trials"])


@router.get("/jobs/{job_id}/trials", response_model=list[TrialPublic])
def list_trials(trials: Trials, job_id: str) -> list[TrialPublic]:
    """A search's trials: status, current values, reports, last and best metric, exploits."""
    return trials.trials(job_id)


@router.get("/jobs/{job_id}/trials/{trial_id}/metrics", response_model=list[TrialMetricPoint])
def trial_metrics(trials: Trials, job_id: str, trial_id: str, since: int = -1) -> list[TrialMetricPoint]:
    """One trial's reports with seq > since, each with the values it trained with."""
    return trials.trial_metrics(job_id, trial_id, since)


@router.get("/jobs/{job_id}/lineage", response_model=list[ExploitPublic])
def lineage(trials: Trials, job_id: str) -> list[ExploitPublic]:
    """PBT's exploits in order: which trial cloned which, at which epoch or step, with which new values."""
    return trials.lineage(job_id)


@router.get("/jobs/{job_id}/best", response_model=BestTrialPublic)
def best(trials: Trials, job_id: str) -> BestTrialPublic:
    """The best trial, its values and (once the search ended) its checkpoint; before, the best so far."""
    return trials.best(job_id)
