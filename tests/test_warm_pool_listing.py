"""GET /v1/cluster lists one warm-pool entry per live node, found by its exact actor name,
and the server reads a bounded tail of each one's log, off the request path. Actors any
job can create with names like the pool's, each logging megabytes, change neither
(bench/harness/warm_pool_attacks.py).
"""

from __future__ import annotations

from api.client import Client
from bench.harness.waiting import wait_for
from bench.harness.warm_pool_attacks import log_figures, squat, unsquat
from service.cluster.local_cluster import LocalHead
from service.cluster.warm_pool import MAX_LOG_BYTES


def test_lookalike_pool_actors_are_not_listed_and_their_logs_are_read_bounded(
    client: Client, server, ray_head: LocalHead
):
    names = squat(ray_head, lookalikes=4, mib=4)
    try:
        before = log_figures(server.url)
        if before is not None:  # wait for a refresh that began after the actors logged
            wait_for(lambda: log_figures(server.url)[0] >= before[0] + 2, 90, "two warm-pool refreshes")
        info = client.cluster()
        alive = {n.node_id for n in info.nodes if n.alive}
        assert [p.node_id for p in info.warm_pool if p.node_id not in alive] == []
        assert len(info.warm_pool) <= len(alive)
        after = log_figures(server.url)
        assert after is not None, "the server exposes no warm-pool log figures"
        reads, read_bytes = after[0] - before[0], after[1] - before[1]
        assert reads >= 1 and read_bytes <= reads * MAX_LOG_BYTES, (reads, read_bytes)
        assert reads <= 3 * len(alive)  # one log per live node and refresh: never one per look-alike actor
    finally:
        unsquat(ray_head, names)
