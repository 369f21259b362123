"""Each node's dataset cache as ``GET /v1/cluster`` shows it: the facts the node's keeper
actor (``raydock-datacache-<node id>``, trainers/data/cache_keeper.py) last printed,
read like the warm pool's (``service.cluster.warm_pool``: the State API for the actor by
its exact name, at most ``MAX_LOG_BYTES`` of its log). The server never looks into the
cache directory itself: any job can write there. Refreshed by the ``warm-pool``
background unit; requests read the snapshot it left.
"""

from __future__ import annotations

import logging

import httpx
from pydantic import ValidationError

from api.cluster_contract import DATA_CACHE_FACTS_PREFIX, data_cache_actor_name
from api.schemas import DataCachePublic
from api.schemas.launch import DataCacheFacts
from service.cluster.warm_pool import _last_facts, _named_actor, live_nodes

log = logging.getLogger("raydock")


class DataCaches:
    """The last snapshot of the nodes' dataset caches, refreshed off the request path."""

    def __init__(self, http: httpx.Client):
        self.http = http
        self._snapshot: list[DataCachePublic] = []
        self.log_reads = 0  # keeper logs read and their bytes since this process started
        self.log_bytes = 0

    def snapshot(self) -> list[DataCachePublic]:
        return list(self._snapshot)

    def refresh(self) -> None:
        self._snapshot = read_data_caches(self.http, self._count)

    def _count(self, read_bytes: int) -> None:
        self.log_reads += 1
        self.log_bytes += read_bytes


def read_data_caches(http: httpx.Client, count=lambda _: None) -> list[DataCachePublic]:
    """The cache of each live node whose keeper has printed its facts."""
    caches = []
    for node_id in live_nodes(http, "the data caches"):
        actor = _named_actor(http, data_cache_actor_name(node_id))
        if actor is None:
            continue
        raw = _last_facts(http, str(actor.get("actor_id")), count, DATA_CACHE_FACTS_PREFIX)
        if not raw:
            continue
        try:
            facts = DataCacheFacts.model_validate(raw)
        except ValidationError as exc:
            log.warning("the data cache keeper of node %s printed facts raydock cannot read: %s", node_id, exc)
            continue
        caches.append(DataCachePublic(**{**facts.model_dump(), "node_id": node_id}))
    return sorted(caches, key=lambda c: c.node_id)
