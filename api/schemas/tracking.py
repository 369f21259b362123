"""Where a job's reports go besides raydock: TensorBoard event files in the job's storage
prefix, an MLflow run on the server's tracking server. The server exports what it takes
in (the training loop changes nothing); shared by training and search specs."""

from __future__ import annotations

from pydantic import Field

from api.schemas.common import Strict

# MLflow experiment names are free text; these bounds keep them to something a UI lists.
EXPERIMENT_RE = r"^[A-Za-z0-9][A-Za-z0-9 ._/:-]{0,199}$"


class MlflowTracking(Strict):
    experiment: str = Field(
        pattern=EXPERIMENT_RE,
        description="MLflow experiment the job's run goes in (made when missing): letters, digits, space . _ / : -, up to 200.",
    )


class TrackingSpec(Strict):
    tensorboard: bool = Field(
        default=False,
        description="Write each report as TensorBoard scalars to `<job storage>/tensorboard/` (download: GET /v1/jobs/{job_id}/tensorboard).",
    )
    mlflow: MlflowTracking | None = Field(
        default=None,
        description="Log the job to MLflow (the server's RAYDOCK_MLFLOW_TRACKING_URI): params from the spec, "
        "metrics by step, the final checkpoint as an artifact; a search logs one nested run per trial.",
    )
