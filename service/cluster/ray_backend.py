"""The one module of raydock that talks to Ray.

Jobs run as Ray jobs (the Jobs API in the dashboard): a job's driver process lives on
the cluster, so it outlives the API process, and Ray captures its logs, stops it, and
uploads its ``working_dir``. Cluster facts come from the dashboard's HTTP API, so the
API process never has to join the cluster as a driver.

Every call has a timeout, and every way of not reaching Ray (connection refused or
reset, timeout, a proxy's 502/503/504, an auth refusal) is ``ClusterUnavailable``: the
caller waits for the cluster instead of blaming the job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx

from api.cluster_contract import DRIVER_MODULES, WARM_CLIENT_MODULE, WORKER_SETUP_HOOK
from api.errors import ClusterUnavailable
from api.schemas import ClusterInfo, DataCachePublic, NodeInfo, WarmProcessPublic
from service.cluster.autoscaler import addable, autoscaler_from_status, load_config
from service.cluster.data_cache import DataCaches
from service.cluster.warm_pool import WarmPool

COLD_ENTRYPOINTS = {kind: f"python -m {module}" for kind, module in DRIVER_MODULES.items()}
# The client forks the driver from the node's warm process, or execs the cold entrypoint (trainers/zygote/).
WARM_ENTRYPOINTS = {kind: f"python -m {WARM_CLIENT_MODULE} {kind}" for kind in DRIVER_MODULES}
CALL_TIMEOUT_S = 10.0
UPLOAD_TIMEOUT_S = 120.0  # a working_dir upload (runs off the monitor's tick)
UNREACHABLE_STATUS = ("status code 502", "status code 503", "status code 504")


@dataclass
class RayJobState:
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    message: str | None


@dataclass
class RayJob:
    submission_id: str
    status: str
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def is_active(self) -> bool:
        return self.status in ("PENDING", "RUNNING")


def ray_auth_token() -> str | None:
    """Ray 2.60 token auth: the token from the environment or Ray's token file."""
    if token := os.environ.get("RAY_AUTH_TOKEN"):
        return token.strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if path.is_file():
        return path.read_text().strip() or None
    return None


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    import requests
    from ray.exceptions import AuthenticationError

    return (requests.exceptions.RequestException, ConnectionError, TimeoutError, AuthenticationError, httpx.HTTPError)


class RayBackend:
    def __init__(
        self,
        address: str,
        *,
        autoscaler_config: str | None = None,
        auth_token: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        warm_start: bool = True,
    ):
        self.address = address.rstrip("/")
        # The autoscaler's own config, for the limits its status report leaves out (service/cluster/autoscaler.py).
        self.autoscaler_config_path = autoscaler_config
        self.autoscaler_config = load_config(autoscaler_config)
        if "://" not in self.address:
            self.address = "http://" + self.address
        token = auth_token or ray_auth_token()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self.entrypoints = WARM_ENTRYPOINTS if warm_start else COLD_ENTRYPOINTS
        self._client = None
        # The last answer of cluster_info and when (monotonic): what /metrics reports, never asking Ray itself.
        self.last_cluster: tuple[float, ClusterInfo] | None = None
        self._http = httpx.Client(base_url=self.address, headers=self.headers, timeout=timeout_s)
        self.pool = WarmPool(self._http)
        self.caches = DataCaches(self._http)

    @contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        try:
            yield
        except ClusterUnavailable:
            raise
        except RuntimeError as exc:
            if any(s in str(exc) for s in UNREACHABLE_STATUS):
                raise ClusterUnavailable(f"Ray dashboard at {self.address} did not answer {what}: {exc}") from exc
            raise
        except _unreachable_errors() as exc:
            raise ClusterUnavailable(
                f"Ray dashboard at {self.address} did not answer {what}: {type(exc).__name__}: {exc}"
            ) from exc

    # ------------------------------------------------------------------ jobs

    @property
    def jobs(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            # Ray's job client logs every closed log tail at INFO; a tail closes as each job ends.
            logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
            timeout_s = self.timeout_s

            class _TimedClient(JobSubmissionClient):
                # Ray's client calls requests without a timeout; a hung dashboard must not hang us.
                def _do_request(self, method, endpoint, **kwargs):
                    kwargs.setdefault("timeout", UPLOAD_TIMEOUT_S if method == "PUT" else timeout_s)
                    return super()._do_request(method, endpoint, **kwargs)

            with self._calling("a connection"):
                self._client = _TimedClient(self.address, headers=self.headers)
        return self._client

    def submit(
        self,
        submission_id: str,
        kind: str,
        runtime_env: dict[str, Any],
        metadata: dict[str, str],
        resources: dict[str, float] | None = None,
    ) -> bool:
        """Submit the driver as Ray job ``submission_id``; True when Ray already had it
        (a retried submit of the same attempt is recognised, never duplicated).
        ``resources`` (CPU, GPU, memory, others by name) are held by the driver itself:
        a job whose workers run as the driver's local ranks."""
        runtime_env = dict(runtime_env)
        runtime_env.setdefault("worker_process_setup_hook", WORKER_SETUP_HOOK)
        with self._calling("a submit"):
            try:
                self.jobs.submit_job(
                    entrypoint=self.entrypoints[kind],
                    submission_id=submission_id,
                    runtime_env=runtime_env,
                    metadata=metadata,
                    **entrypoint_resources(resources or {}),
                )
            except RuntimeError as exc:
                if "already exists" in str(exc):
                    return True
                raise
        return False

    def state(self, submission_id: str) -> RayJobState | None:
        """None when Ray has no such job (e.g. the cluster was replaced)."""
        with self._calling("a job status"):
            try:
                info = self.jobs.get_job_info(submission_id)
            except RuntimeError as exc:
                if "does not exist" in str(exc) or "404" in str(exc):
                    return None
                raise
        return RayJobState(status=_status(info.status), message=info.message)

    def list_jobs(self) -> list[RayJob]:
        """Every submitted Ray job the cluster remembers."""
        with self._calling("the job list"):
            infos = self.jobs.list_jobs()
        return [
            RayJob(submission_id=i.submission_id, status=_status(i.status), metadata=dict(i.metadata or {}))
            for i in infos
            if i.submission_id
        ]

    def logs(self, submission_id: str) -> str:
        """The job's whole log."""
        with self._calling("a log read"):
            return self.jobs.get_job_logs(submission_id)

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """The job's log from its start, then each new piece as it is written; ends once
        the job has ended and all of it was sent (Ray's log tail, a websocket)."""
        async for piece in self.jobs.tail_job_logs(submission_id):
            yield piece

    def stop(self, submission_id: str) -> None:
        """Stop a Ray job; one that has ended or never existed needs no stop."""
        with self._calling("a stop"):
            try:
                self.jobs.stop_job(submission_id)
            except RuntimeError as exc:
                if "does not exist" not in str(exc) and "404" not in str(exc):
                    raise

    def delete(self, submission_id: str) -> bool:
        """Delete Ray's record of an ended Ray job; False when Ray keeps it (still stopping)."""
        with self._calling("a delete"):
            try:
                return bool(self.jobs.delete_job(submission_id))
            except RuntimeError as exc:
                if any(s in str(exc) for s in UNREACHABLE_STATUS):
                    raise  # a proxy's answer for a dashboard that is down
                return "does not exist" in str(exc) or "404" in str(exc)  # gone already: nothing to keep

    # ------------------------------------------------------------------ cluster

    def _get(self, path: str) -> dict:
        try:
            r = self._http.get(path)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise ClusterUnavailable(f"Ray dashboard at {self.address} did not answer {path}: {exc}") from exc

    def answers(self, timeout_s: float) -> bool:
        """Whether the cluster answers now: its GCS health as the dashboard reports it
        (one small GET within ``timeout_s``; what GET /healthz says of Ray)."""
        try:
            return self._http.get("/api/gcs_healthz", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
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
                resources=schedulable(n.get("resources_total", {})),
            )
            for n in nodes_raw
        ]
        cpu_used, cpu_total = usage.get("CPU", [0.0, 0.0])
        gpu_used, gpu_total = usage.get("GPU", [0.0, 0.0])
        info = ClusterInfo(
            address=self.address,
            nodes=nodes,
            cpus_total=cpu_total,
            cpus_free=cpu_total - cpu_used,
            gpus_total=gpu_total,
            gpus_free=gpu_total - gpu_used,
            usage_at=_unix_time(status.get("time")),
            autoscaler=autoscaler_from_status(status, self.autoscaler_config, self.autoscaler_config_path),
        )
        self.last_cluster = (time.monotonic(), info)
        return info

    def warm_pool(self) -> list[WarmProcessPublic]:
        """Each node's warm process (trainers/zygote/) as the monitor's last refresh saw it;
        empty when there is none or the dashboard could not say."""
        return self.pool.snapshot()

    def refresh_warm_pool(self) -> None:
        """Read the warm pool and the nodes' dataset caches again from the dashboard (its
        background unit's step)."""
        self.pool.refresh()
        self.caches.refresh()

    def data_caches(self) -> list[DataCachePublic]:
        """Each node's dataset cache as the last refresh saw it (trainers/data/cache_keeper.py)."""
        return self.caches.snapshot()

    def capacity(self) -> tuple[ClusterInfo, tuple[float, float]]:
        """The cluster now and what its autoscaler can still add (infinite when its
        limits are unknown)."""
        info = self.cluster_info()
        return info, addable(info)


def entrypoint_resources(resources: dict[str, float]) -> dict[str, Any]:
    """``submit_job``'s entrypoint arguments for ``resources``."""
    out: dict[str, Any] = {}
    rest = dict(resources)
    if cpus := rest.pop("CPU", 0.0):
        out["entrypoint_num_cpus"] = cpus
    if gpus := rest.pop("GPU", 0.0):
        out["entrypoint_num_gpus"] = gpus
    if memory := rest.pop("memory", 0.0):
        out["entrypoint_memory"] = int(memory)
    if rest:
        out["entrypoint_resources"] = rest
    return out


def schedulable(resources: dict[str, Any]) -> dict[str, float]:
    """A node's resources a job can ask for (not Ray's per-node ``node:<ip>`` markers nor
    the object store)."""
    return {
        k: float(v)
        for k, v in resources.items()
        if not k.startswith("node:") and k != "object_store_memory" and isinstance(v, (int, float))
    }


def _unix_time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _status(status: Any) -> str:
    return str(status.value if hasattr(status, "value") else status)
