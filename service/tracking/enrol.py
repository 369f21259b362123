"""What submit does for tracking: refuse a spec asking for MLflow on a server that has
no tracking server, and note a tracked job for the exporter (in the submit's transaction)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.errors import InvalidSpec
from api.schemas import JobSpec
from service.db.tracking_models import TrackingExportRow
from service.settings import Settings


def check(spec: JobSpec, settings: Settings) -> None:
    tracking = spec.tracking
    if tracking is not None and tracking.mlflow is not None and not settings.tracking.mlflow_tracking_uri:
        raise InvalidSpec(
            "tracking.mlflow asks for an MLflow run, but this server has no MLflow tracking server. "
            "Leave out tracking.mlflow, or set RAYDOCK_MLFLOW_TRACKING_URI on the server.",
            code="mlflow_not_configured",
        )


def enrol(s: Session, job_id: str, spec: JobSpec) -> None:
    tracking = spec.tracking
    if tracking is None or not (tracking.tensorboard or tracking.mlflow):
        return
    s.add(
        TrackingExportRow(
            job_id=job_id,
            tensorboard=tracking.tensorboard,
            mlflow_experiment=tracking.mlflow.experiment if tracking.mlflow else None,
            trial_runs={},
        )
    )
