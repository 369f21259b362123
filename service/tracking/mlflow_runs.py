"""A job as MLflow runs, through MLflow's own client: one run per job in its project's
experiment (``names.mlflow_experiment``; params from its spec, metrics by step, tags
``raydock.job_id`` and ``raydock.project``, the final checkpoint as an artifact at the
end); a search's trials as runs nested under it, in its experiment (``mlflow.parentRunId``)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from service.files.archive import checkpoint_tar
from service.tracking.names import mlflow_key, params, scalars

BATCH = 1000  # MLflow's limit of metrics per log_batch
PARAM_BATCH = 100  # and of params
MAX_ARTIFACT_BYTES = 2 << 30  # a final checkpoint larger than this is not copied to MLflow
END_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELLED": "KILLED"}


# MLflow's own HTTP defaults retry a call 7 times over minutes (timeout 120 s each): a tracking
# server that is down would hold the exporter that long per call. The operator's values win.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


def _client(uri: str):
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient  # heavy: only once a job asks for MLflow

    return MlflowClient(tracking_uri=uri)


def unreachable(exc: BaseException) -> bool:
    """Whether MLflow failed as a server that does not answer (not as a refusal of what was sent)."""
    import requests

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return True
        if "API request to" in str(seen) and ("Max retries exceeded" in str(seen) or "timed out" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class MlflowRuns:
    def __init__(self, tracking_uri: str) -> None:
        self.uri = tracking_uri
        self._mlflow = None

    @property
    def client(self):
        if self._mlflow is None:
            self._mlflow = _client(self.uri)
        return self._mlflow

    def experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else self.client.create_experiment(name)

    def start(self, experiment: str, job_id: str, name: str, kind: str, project: str, spec: dict[str, Any]) -> str:
        """The job's run; its id is stored before anything is logged to it, so a restart reuses it."""
        run = self.client.create_run(
            self.experiment_id(experiment),
            run_name=name,
            tags={"raydock.job_id": job_id, "raydock.kind": kind, "raydock.project": project},
        )
        self._params(run.info.run_id, params(spec))
        return run.info.run_id

    def start_trial(self, parent: str, job_id: str, project: str, trial_id: str, config: dict[str, Any]) -> str:
        """A trial's run, in its parent's experiment (whatever that experiment is named now)."""
        run = self.client.create_run(
            self.client.get_run(parent).info.experiment_id,
            run_name=trial_id,
            tags={
                "raydock.job_id": job_id,
                "raydock.project": project,
                "raydock.trial_id": trial_id,
                "mlflow.parentRunId": parent,
            },
        )
        self._params(run.info.run_id, params(config))
        return run.info.run_id

    def _params(self, run_id: str, values: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in values.items()]
        for i in range(0, len(items), PARAM_BATCH):
            self.client.log_batch(run_id, params=items[i : i + PARAM_BATCH])

    def log(self, run_id: str, rows: list[tuple[int, float, dict]]) -> int:
        """Log reports ``(step, ts, values)``; returns the values logged."""
        from mlflow.entities import Metric

        metrics = [
            Metric(mlflow_key(key), value, int(ts * 1000), step)
            for step, ts, values in rows
            for key, value in scalars(values).items()
        ]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + BATCH])
        return len(metrics)

    def finish(
        self, run_id: str, status: str, checkpoint: str | None, prefix: str, trial_runs: list[str]
    ) -> str | None:
        """Copy the final checkpoint and close the runs; returns why the checkpoint was
        left out, if it was."""
        note = None
        if checkpoint:
            note = self._checkpoint(run_id, checkpoint, prefix)
        for trial_run in trial_runs:
            self.client.set_terminated(trial_run, END_STATUS.get(status, "FINISHED"))
        self.client.set_terminated(run_id, END_STATUS.get(status, "FINISHED"))
        return note

    def _checkpoint(self, run_id: str, uri: str, prefix: str) -> str | None:
        """The checkpoint as ``checkpoint/checkpoint.tar.gz``, packed by the download's
        archive code: what the job put in its folder is copied, never what a link in it
        points to (the job's files are not trusted)."""
        with tempfile.TemporaryDirectory(prefix="raydock-mlflow-") as tmp:
            path = os.path.join(tmp, "checkpoint.tar.gz")
            size = 0
            try:
                with open(path, "wb") as out:
                    for piece in checkpoint_tar(uri, prefix):
                        size += len(piece)
                        if size > MAX_ARTIFACT_BYTES:
                            return f"the final checkpoint is over {MAX_ARTIFACT_BYTES} bytes packed; it stays in raydock's storage"
                        out.write(piece)
            except OSError as exc:
                return f"the final checkpoint could not be read: {exc}"
            self.client.log_artifact(run_id, path, artifact_path="checkpoint")
        return None
