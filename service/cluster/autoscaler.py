"""What a cluster's autoscaler can add, read from the dashboard's ``/api/cluster_status``.

Every Ray head runs an autoscaler monitor; without an autoscaling config it runs a
read-only provider whose node types mirror the nodes present, one anonymous type
``node_<node id>`` per node. A real autoscaler (cluster launcher, KubeRay, the fake
multi-node provider) names its node types after its config (``ray.worker.cpu``), so a
report with any node type that is not such a mirror means an autoscaler is there.

The report gives node types with their running and pending counts, but not their
limits (``max_workers``) nor their sizes. Those come from the autoscaler's own config
file when raydock is given it (``RAYDOCK_AUTOSCALER_CONFIG``, e.g. the cluster
launcher's ``~/ray_bootstrap_config.yaml`` on the head). Without it the limits are
unknown and count as unbounded: a job is accepted and started, its pending demand asks
the autoscaler for nodes, and a job the autoscaler cannot serve fails with
``NO_RESOURCES`` once its workers do not start within ``RAYDOCK_WORKER_START_TIMEOUT_S``.

Reported by the v1 autoscaler (the default outside KubeRay); the v2 autoscaler does not
write this report, and a cluster running it reads as one without an autoscaler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from api.schemas import AutoscalerPublic, ClusterInfo, NodeTypeCapacity


def load_config(path: str | Path | None) -> dict[str, Any] | None:
    """An autoscaler cluster config (YAML or JSON), or None when not given."""
    if not path:
        return None
    config = yaml.safe_load(Path(path).expanduser().read_text())
    if not isinstance(config, dict) or "available_node_types" not in config:
        raise ValueError(f"{path} is not a Ray autoscaler config: it has no available_node_types")
    return config


def _is_readonly_mirror(node_type: str, node_id: str) -> bool:
    return node_type.lower() == f"node_{node_id}".lower()


def _camel(name: str) -> str:
    # The dashboard camel-cases every dict key of its answers (ray.dashboard.utils.to_camel_case),
    # node type names included when they are keys; values keep their spelling.
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def autoscaler_from_status(
    cluster_status: dict[str, Any] | None, config: dict[str, Any] | None, config_path: str | None = None
) -> AutoscalerPublic | None:
    """The autoscaler of a cluster from its ``clusterStatus``, or None when it has none."""
    report = (cluster_status or {}).get("autoscalerReport")
    if not report:
        return None
    # node (id or ip) -> node type for every node the autoscaler manages, launching ones
    # included; the type names are values here, so they keep their spelling.
    mapping: dict[str, str] = report.get("nodeTypeMapping") or {}
    if not mapping or all(_is_readonly_mirror(t, n) for n, t in mapping.items()):
        return None
    known = {_camel(name): name for name in [*((config or {}).get("available_node_types") or {}), *mapping.values()]}

    def by_type(counts: dict[str, Any] | None) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, n in (counts or {}).items():
            name = known.get(key, key)
            out[name] = out.get(name, 0) + int(n)
        return out

    # Present: nodes whose raylets report. Pending: launches in flight and nodes still
    # being set up; they are part of what the autoscaler adds, not of what is present.
    running = by_type(report.get("activeNodes"))
    for name, n in by_type(report.get("idleNodes")).items():
        running[name] = running.get(name, 0) + n
    pending = by_type(report.get("pendingLaunches"))
    for entry in report.get("pendingNodes") or []:
        if isinstance(entry, (list, tuple)) and len(entry) >= 3:  # [node_id, ip, node_type, status]
            name = entry[2] if len(entry) >= 4 else entry[1]
            pending[name] = pending.get(name, 0) + 1
    return _capacity(running, pending, config, config_path)


def _capacity(
    running: dict[str, int], pending: dict[str, int], config: dict[str, Any] | None, config_path: str | None
) -> AutoscalerPublic:
    types = (config or {}).get("available_node_types") or {}
    head_type = (config or {}).get("head_node_type")
    names = list(dict.fromkeys([*types, *running, *pending]))
    node_types = []
    for name in names:
        spec = types.get(name) or {}
        limit = spec.get("max_workers") if name in types else None
        if name == head_type:
            limit = running.get(name, 1)  # the head is never launched by the autoscaler
        node_types.append(
            NodeTypeCapacity(
                name=name,
                resources={k: float(v) for k, v in (spec.get("resources") or {}).items()},
                running=running.get(name, 0),
                pending=pending.get(name, 0),
                max_workers=limit,
            )
        )
    if config is None:
        return AutoscalerPublic(node_types=node_types, cpus_addable=None, gpus_addable=None)
    # Nodes each type may still add (pending ones are not present yet, so they count),
    # within the cluster-wide max_workers, largest nodes first: an upper bound per resource.
    workers_now = sum(t.running for t in node_types if t.name != head_type)
    budget = max(0, int(config.get("max_workers", 10**9)) - workers_now)

    def can_add(resource: str) -> float:
        left, total = budget, 0.0
        for t in sorted(node_types, key=lambda t: -t.resources.get(resource, 0.0)):
            if t.name == head_type or t.max_workers is None:
                continue
            n = min(max(0, t.max_workers - t.running), left)
            total += n * t.resources.get(resource, 0.0)
            left -= n
        return total

    return AutoscalerPublic(
        node_types=node_types, cpus_addable=can_add("CPU"), gpus_addable=can_add("GPU"), limits_from=config_path
    )


def addable(info: ClusterInfo) -> tuple[float, float]:
    """(CPUs, GPUs) the cluster's autoscaler can add beyond the nodes present."""
    a = info.autoscaler
    if a is None:
        return 0.0, 0.0
    unknown = float("inf")
    return (unknown if a.cpus_addable is None else a.cpus_addable), (
        unknown if a.gpus_addable is None else a.gpus_addable
    )
