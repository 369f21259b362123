"""The warm pool as the dashboard shows it, for ``GET /v1/cluster``: each node's
supervisor actor (a named actor in namespace ``raydock``, from the State API) and the
last facts it printed (a ``RAYDOCK_WARM_POOL {json}`` line on its stdout, from the log
API). The server never joins the cluster to ask the actors themselves.

The names here are the ones trainers/zygote/supervisor.py uses; the server and the code
on the cluster share no module.
"""

from __future__ import annotations

import json
import logging

import httpx
from pydantic import ValidationError

from api.schemas import WarmProcessPublic

NAMESPACE = "raydock"
NAME_PREFIX = "raydock-warm-"
FACTS_PREFIX = "RAYDOCK_WARM_POOL "
MAX_POOL_ACTORS = 1000
FACTS_LINES = 200  # the supervisor prints its facts on each change; the warm process logs a few lines of its own

log = logging.getLogger("raydock")


def read_warm_pool(http: httpx.Client) -> list[WarmProcessPublic]:
    """Every live warm process of the cluster; empty when the dashboard cannot say."""
    params = [
        ("limit", str(MAX_POOL_ACTORS)),
        ("filter_keys", "ray_namespace"),
        ("filter_predicates", "="),
        ("filter_values", NAMESPACE),
        ("filter_keys", "state"),
        ("filter_predicates", "="),
        ("filter_values", "ALIVE"),
    ]
    try:
        r = http.get("/api/v0/actors", params=params)
        r.raise_for_status()
        actors = r.json()["data"]["result"]["result"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not list the warm pool's actors: %s", exc)
        return []
    pool = []
    for actor in actors:
        if not str(actor.get("name") or "").startswith(NAME_PREFIX):
            continue
        facts = _last_facts(http, str(actor.get("actor_id")))
        try:
            pool.append(
                WarmProcessPublic(
                    node_id=facts.get("node_id") or actor.get("node_id") or "",
                    ready=bool(facts.get("ready")),
                    pid=facts.get("pid"),
                    started_at=facts.get("started") or 0.0,
                    restarts=facts.get("restarts") or 0,
                    jobs_served=facts.get("jobs_served") or 0,
                    running=facts.get("running") or 0,
                    idle_since=facts.get("idle_since"),
                    idle_timeout_s=facts.get("idle_timeout_s") or 0.0,
                )
            )
        except ValidationError as exc:
            log.warning("the warm pool actor %s printed facts raydock cannot read: %s", actor.get("name"), exc)
    return sorted(pool, key=lambda p: p.node_id)


def _last_facts(http: httpx.Client, actor_id: str) -> dict:
    try:
        r = http.get("/api/v0/logs/file", params={"actor_id": actor_id, "suffix": "out", "lines": str(FACTS_LINES)})
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    for line in reversed(r.text.splitlines()):
        if line.startswith(FACTS_PREFIX):
            try:
                facts = json.loads(line[len(FACTS_PREFIX) :])
            except ValueError:
                continue
            return facts if isinstance(facts, dict) else {}
    return {}
