"""Where a job's reports go besides raydock: TensorBoard event files in the job's storage
prefix, an MLflow run on the server's tracking server. The server exports what it takes
in (the training loop changes nothing); shared by training and search specs."""

from __future__ import annotations

from pydantic import Field

from api.schemas.common import Strict

# MLflow experiment names are free text; these bounds keep them to something a UI lists.
# The experiment made is ``<project>/<experiment>`` (service/tracking/names.py): a project
# name (63) + "/" + 192 fit the 256 characters MLflow's database stores.
EXPERIMENT_RE = r"^[A-Za-z0-9][A-Za-z0-9 ._/:-]{0,191}$"


class MlflowTracking(Strict):
    experiment: str = Field(
        pattern=EXPERIMENT_RE,
        description="MLflow experiment the job's run goes in, inside its project: the run is logged to `<project>/<experiment>` "
        "(made when missing). Letters, digits, space . _ / : -, up to 192.",
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
