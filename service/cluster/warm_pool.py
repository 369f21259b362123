"""The warm pool as the dashboard shows it, for ``GET /v1/cluster``: for each live node,
the supervisor actor named exactly ``raydock-warm-<node id>`` (namespace ``raydock``,
from the State API) and the last facts it printed (a ``RAYDOCK_WARM_POOL {json}`` line on
its stdout, from the log API). The server never joins the cluster to ask the actors.

Any job can create actors with names like these and write into any log file on its node
(jobs share one OS user), so nothing here grows with what jobs do: one actor per live
node by its exact name (at most ``MAX_NODES``), and of each log at most ``MAX_LOG_BYTES``
read, of which only the last ``TAIL_BYTES`` are kept. ``WarmPool.refresh`` runs as the
``warm-pool`` background unit every ``REFRESH_S``; requests read the snapshot it left.

The names and the facts are the contract trainers/zygote/supervisor.py writes
(``api.cluster_contract``, ``api.schemas.launch.WarmPoolFacts``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable

import httpx
from pydantic import ValidationError

from api.cluster_contract import WARM_FACTS_PREFIX, WARM_NAMESPACE, warm_actor_name
from api.schemas import WarmProcessPublic
from api.schemas.launch import WarmPoolFacts

MAX_NODES = 1000
FACTS_LINES = 20  # the supervisor prints its facts on each change; the warm process logs a few lines of its own
MAX_LOG_BYTES = 64 * 1024  # read of one actor's log tail, at most; a facts line is ~300 bytes
TAIL_BYTES = 8 * 1024  # kept of what was read: the last facts line is near the end
REFRESH_S = 10.0

log = logging.getLogger("raydock")


class WarmPool:
    """The last snapshot of the cluster's warm pool, refreshed off the request path."""

    def __init__(self, http: httpx.Client, refresh_s: float = REFRESH_S):
        self.http, self.refresh_s = http, refresh_s
        self._snapshot: list[WarmProcessPublic] = []
        self._lock = threading.Lock()
        self.log_reads = 0  # logs read and their bytes since this process started (GET /metrics)
        self.log_bytes = 0

    def snapshot(self) -> list[WarmProcessPublic]:
        return list(self._snapshot)

    def refresh(self) -> None:
        """Read the pool again (the ``warm-pool`` background unit runs this every ``refresh_s``)."""
        with self._lock:
            self._snapshot = self.read()

    def read(self) -> list[WarmProcessPublic]:
        """The warm process of each live node that has one; empty when the dashboard cannot say."""
        return read_warm_pool(self.http, self._count)

    def _count(self, read_bytes: int) -> None:
        self.log_reads += 1
        self.log_bytes += read_bytes


def read_warm_pool(http: httpx.Client, count: Callable[[int], None] = lambda _: None) -> list[WarmProcessPublic]:
    """The warm process of each live node that has one; ``count`` hears the bytes of each log read."""
    pool = []
    for node_id in live_nodes(http, "the warm pool"):
        actor = _supervisor(http, node_id)
        if actor is None:
            continue
        raw = _last_facts(http, str(actor.get("actor_id")), count)
        try:
            facts = WarmPoolFacts.model_validate(raw or {"node_id": node_id})  # none printed yet: starting
            pool.append(
                WarmProcessPublic(
                    node_id=node_id,
                    ready=facts.ready,
                    pid=facts.pid,
                    started_at=facts.started,
                    restarts=facts.restarts,
                    jobs_served=facts.jobs_served,
                    running=facts.running,
                    idle_since=facts.idle_since,
                    idle_timeout_s=facts.idle_timeout_s,
                )
            )
        except ValidationError as exc:
            log.warning("the warm pool actor of node %s printed facts raydock cannot read: %s", node_id, exc)
    return sorted(pool, key=lambda p: p.node_id)


def live_nodes(http: httpx.Client, what: str) -> list[str]:
    """The ids of the cluster's live nodes (at most MAX_NODES); none when the dashboard cannot say."""
    try:
        nodes = _result(http, "/api/v0/nodes", [("limit", str(MAX_NODES)), *_where("state", "ALIVE")])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not list the cluster's nodes for %s: %s", what, exc)
        return []
    return [node_id for node in nodes if (node_id := str(node.get("node_id") or ""))]


def _where(key: str, value: str) -> list[tuple[str, str]]:
    return [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]


def _result(http: httpx.Client, path: str, params: list[tuple[str, str]]) -> list[dict]:
    r = http.get(path, params=params)
    r.raise_for_status()
    return r.json()["data"]["result"]["result"]


def _supervisor(http: httpx.Client, node_id: str) -> dict | None:
    """The live actor named ``raydock-warm-<node_id>`` in namespace raydock, if any."""
    return _named_actor(http, warm_actor_name(node_id))


def _named_actor(http: httpx.Client, name: str) -> dict | None:
    """The live actor named exactly ``name`` in namespace raydock, if any."""
    params = [("limit", "1"), *_where("name", name), *_where("ray_namespace", WARM_NAMESPACE)]
    try:
        actors = _result(http, "/api/v0/actors", [*params, *_where("state", "ALIVE")])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not look up the actor %s: %s", name, exc)
        return None
    return actors[0] if actors and actors[0].get("name") == name else None


def _last_facts(
    http: httpx.Client, actor_id: str, count: Callable[[int], None], prefix: str = WARM_FACTS_PREFIX
) -> dict:
    tail = _log_tail(http, actor_id, count)
    for line in reversed(tail.splitlines()):
        if line.startswith(prefix.encode()):
            try:
                facts = json.loads(line[len(prefix) :])
            except ValueError:
                continue
            return facts if isinstance(facts, dict) else {}
    return {}


def _log_tail(http: httpx.Client, actor_id: str, count: Callable[[int], None]) -> bytes:
    """The last TAIL_BYTES of the actor's stdout, reading at most MAX_LOG_BYTES of it."""
    params = {"actor_id": actor_id, "suffix": "out", "lines": str(FACTS_LINES)}
    tail, read = b"", 0
    try:
        with http.stream("GET", "/api/v0/logs/file", params=params) as r:
            r.raise_for_status()
            for chunk in r.iter_bytes():
                chunk = chunk[: MAX_LOG_BYTES - read]
                read += len(chunk)
                tail = (tail + chunk)[-TAIL_BYTES:]
                if read >= MAX_LOG_BYTES:
                    log.warning("the warm pool actor %s logs more than %d bytes of tail; read no more", actor_id, read)
                    break
    except httpx.HTTPError:
        return b""
    finally:
        count(read)
    return tail
