"""The one module of raydock that talks to Ray.

Jobs run as Ray jobs (the Jobs API in the dashboard): a job's driver process lives on
the cluster, so it outlives the API process, and Ray captures its logs, stops it, and
uploads its ``working_dir``. Cluster facts come from the dashboard's HTTP API, so the
API process never has to join the cluster as a driver.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.schemas import ClusterInfo, NodeInfo, TrainSpec
from service.autoscaler import addable, autoscaler_from_status, load_config

DRIVER_ENTRYPOINT = "python -m trainers.driver"
WORKER_SETUP_HOOK = "trainers.worker_setup.setup"


class ClusterUnavailable(Exception):
    """The Ray dashboard did not answer."""


@dataclass
class RayJobState:
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    message: str | None


def ray_auth_token() -> str | None:
    """Ray 2.60 token auth: the token from the environment or Ray's token file."""
    if token := os.environ.get("RAY_AUTH_TOKEN"):
        return token.strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if path.is_file():
        return path.read_text().strip() or None
    return None


class RayBackend:
    def __init__(self, address: str, *, autoscaler_config: str | None = None):
        self.address = address.rstrip("/")
        # The autoscaler's own config, for the limits its status report leaves out (service/autoscaler.py).
        self.autoscaler_config_path = autoscaler_config
        self.autoscaler_config = load_config(autoscaler_config)
        if "://" not in self.address:
            self.address = "http://" + self.address
        token = ray_auth_token()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.has_autoscaler = False
        self._client = None
        self._http = httpx.Client(base_url=self.address, headers=self.headers, timeout=10)

    # ------------------------------------------------------------------ jobs

    @property
    def jobs(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.address, headers=self.headers)
            except Exception as exc:  # noqa: BLE001 - any connection failure means the same to us
                raise ClusterUnavailable(f"Ray dashboard at {self.address} did not answer: {exc}") from exc
        return self._client

    def submit(self, submission_id: str, spec: TrainSpec, env: dict[str, str]) -> str:
        runtime_env: dict[str, Any] = dict(spec.runtime_env or {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
        if spec.working_dir:
            runtime_env["working_dir"] = spec.working_dir
        runtime_env.setdefault("worker_process_setup_hook", WORKER_SETUP_HOOK)
        try:
            return self.jobs.submit_job(
                entrypoint=DRIVER_ENTRYPOINT,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata={"raydock_job": env.get("RAYDOCK_JOB_ID", "")},
            )
        except RuntimeError as exc:
            # A retried submit of the same attempt: the Ray job already exists.
            if "already exists" in str(exc):
                return submission_id
            raise

    def state(self, submission_id: str) -> RayJobState | None:
        """None when Ray has no such job (e.g. the cluster was replaced)."""
        try:
            info = self.jobs.get_job_info(submission_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise
        return RayJobState(status=str(info.status.value if hasattr(info.status, "value") else info.status), message=info.message)

    def logs(self, submission_id: str) -> str:
        return self.jobs.get_job_logs(submission_id)

    def stop(self, submission_id: str) -> None:
        self.jobs.stop_job(submission_id)

    def delete(self, submission_id: str) -> None:
        try:
            self.jobs.delete_job(submission_id)
        except RuntimeError:
            pass  # gone already, or still stopping: nothing of ours depends on it

    # ------------------------------------------------------------------ cluster

    def _get(self, path: str) -> dict:
        try:
            r = self._http.get(path)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise ClusterUnavailable(f"Ray dashboard at {self.address} did not answer {path}: {exc}") from exc

    def ping(self) -> bool:
        try:
            self._get("/api/version")
            return True
        except ClusterUnavailable:
            return False

    def cluster_info(self) -> ClusterInfo:
        nodes_raw = self._get("/api/v0/nodes?limit=10000")["data"]["result"]["result"]
        status = self._get("/api/cluster_status")["data"]["clusterStatus"]
        usage = status["loadMetricsReport"]["usage"]
        nodes = [
            NodeInfo(
                node_id=n["node_id"],
                ip=n["node_ip"],
                alive=n["state"] == "ALIVE",
                is_head=bool(n.get("is_head_node")),
                cpus=n.get("resources_total", {}).get("CPU", 0.0),
                gpus=n.get("resources_total", {}).get("GPU", 0.0),
            )
            for n in nodes_raw
        ]
        cpu_used, cpu_total = usage.get("CPU", [0.0, 0.0])
        gpu_used, gpu_total = usage.get("GPU", [0.0, 0.0])
        return ClusterInfo(
            address=self.address,
            nodes=nodes,
            cpus_total=cpu_total,
            cpus_free=cpu_total - cpu_used,
            gpus_total=gpu_total,
            gpus_free=gpu_total - gpu_used,
            autoscaler=autoscaler_from_status(status, self.autoscaler_config, self.autoscaler_config_path),
        )

    def max_node_capacity(self) -> tuple[float, float]:
        """(CPUs, GPUs) the alive nodes have in all plus what the autoscaler can still
        add (infinite when its limits are unknown): the most a job can ever get."""
        info = self.cluster_info()
        alive = [n for n in info.nodes if n.alive]
        self.has_autoscaler = info.autoscaler is not None  # for the wording of a refusal
        extra_cpus, extra_gpus = addable(info)
        return sum(n.cpus for n in alive) + extra_cpus, sum(n.gpus for n in alive) + extra_gpus

