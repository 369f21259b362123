"""The dataset cache's keeper: one detached actor per node that prints what the node's
cache holds, for ``GET /v1/cluster``.

The server never looks into a node's cache directory (any job can write there): the
keeper, on the node, looks every ``LOOK_S`` and prints the cache's facts
(``api.schemas.launch.DataCacheFacts``) as one ``RAYDOCK_DATA_CACHE {json}`` line on
its stdout when they change; the server reads the last such line through Ray's log API,
as it reads the warm pool's (``service/cluster/node_facts.py``). A job that uses the cache
starts its node's keeper unless it runs (named ``raydock-datacache-<node id>``). It holds
no CPU.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from api.cluster_contract import DATA_CACHE_FACTS_PREFIX, WARM_NAMESPACE, data_cache_actor_name
from trainers.data.cache import DataCache

LOOK_S = 2.0
log = logging.getLogger(__name__)
_started: set[str] = set()  # nodes this process has started (or found) a keeper on


class Keeper:
    def __init__(self, node_id: str, root: str, max_bytes: int):
        self.node_id, self.cache = node_id, DataCache(root, max_bytes)
        self.facts: dict = {}
        self.seen = False  # whether the directory has existed since the keeper started
        threading.Thread(target=self._watch, daemon=True, name="data-cache-keeper").start()

    def ping(self) -> dict:
        return self.look()

    def look(self) -> dict:
        """The cache's facts now; printed when they changed. The keeper leaves once the
        directory it has seen is gone (the cache was removed): nothing is left to report."""
        if not os.path.isdir(self.cache.root):
            if self.seen:
                self._leave()
            return self.facts
        self.seen = True
        try:
            stats, counters = self.cache.stats(), self.cache.counters()
        except OSError as exc:
            log.warning("data cache %s: %s", self.cache.root, exc)
            return self.facts
        facts = {
            "node_id": self.node_id,
            "entries": stats.entries,
            "bytes": stats.bytes,
            "cap_bytes": stats.cap_bytes,
            **counters,
        }
        if facts != {k: v for k, v in self.facts.items() if k != "updated"}:
            self.facts = {**facts, "updated": time.time()}
            print(DATA_CACHE_FACTS_PREFIX + json.dumps(self.facts), flush=True)
        return self.facts

    def _leave(self) -> None:
        import ray

        print(f"data cache keeper of node {self.node_id} exits: {self.cache.root} is gone", flush=True)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        time.sleep(60)  # the kill ends this process

    def _watch(self) -> None:
        while True:
            self.look()
            time.sleep(LOOK_S)


def ensure_keeper(cache: DataCache) -> None:
    """Start this node's keeper unless it runs (best effort: a process outside Ray, such
    as a forked local rank, starts none; its driver does)."""
    ray = sys.modules.get("ray")  # a process that never imported Ray has not joined a cluster
    if ray is None or not ray.is_initialized():
        return
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = ray.get_runtime_context().get_node_id()
        if node_id in _started:
            return
        ray.remote(Keeper).options(
            name=data_cache_actor_name(node_id),
            namespace=WARM_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(node_id, cache.root, cache.max_bytes)
        _started.add(node_id)
    except Exception as exc:  # the cache works without its report
        log.warning("could not start the data cache keeper: %s", exc)
