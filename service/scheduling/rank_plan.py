"""Whether an attempt's driver runs the job's workers as its own local ranks, and what
its Ray job then holds.

A fixed-size training job that ``api.local_ranks.cold_reason`` passes and whose workers
all fit one node of the cluster runs as ranks forked from its driver
(``trainers.ranks``); the driver's Ray job holds every worker's resources as its
entrypoint resources, so Ray counts them as it counts worker actors. Anything else, or
``RAYDOCK_LOCAL_RANKS=false``: no entrypoint resources, Ray Train's worker actors.
"""

from __future__ import annotations

import logging

from api.local_ranks import cold_reason
from api.schemas import JobSpec, TrainSpec
from service.scheduling import node_fit
from service.settings import Settings

log = logging.getLogger("raydock.rank_plan")


def entrypoint_resources(spec: JobSpec, settings: Settings, backend) -> dict[str, float] | None:
    """The resources the attempt's driver holds for its local ranks; None when the job
    keeps Ray Train's worker actors."""
    if not settings.startup.local_ranks or not isinstance(spec, TrainSpec) or cold_reason(spec) is not None:
        return None
    # Admission asked the cluster a moment ago; a backend that has not, asks now.
    last = getattr(backend, "last_cluster", None)
    try:
        info = last[1] if last is not None else backend.cluster_info()
    except Exception as exc:  # noqa: BLE001 - no cluster view: the cold path places the workers itself
        log.info("no cluster view for the local ranks decision (%s): Ray Train places the workers", exc)
        return None
    return node_fit.one_node_holds(spec.scaling, info)
