"""The dataset cache on the session's Ray cluster: a server with the cache on runs one tiny
built-in job twice; the first reads digits from its source, the second from the node's
cache (the cache's own counters), and ``GET /v1/cluster`` shows the node's cache as its
keeper reports it."""

from __future__ import annotations

import time

import pytest

from api.client import Client
from bench.harness.servers import ServerProcess
from trainers.data.cache import DataCache
from tests.support.specs import BASE

CAP = 64 * 1024 * 1024


@pytest.fixture()
def cache_server(ray_head, tmp_path):
    cache_dir = tmp_path / "cache"
    proc = ServerProcess(
        tmp_path / "server",
        ray_head.dashboard_url,
        extra_env={"RAYDOCK_DATA_CACHE_BYTES": str(CAP), "RAYDOCK_DATA_CACHE_DIR": str(cache_dir)},
    ).start()
    yield proc, DataCache(str(cache_dir), CAP)
    proc.stop()


def run_tiny(client: Client, name: str) -> None:
    job = client.submit({**BASE, "name": name, "max_steps": 2})
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error


def test_a_second_job_reads_its_dataset_from_the_node_cache(cache_server):
    server, cache = cache_server
    with Client(server.url) as client:
        run_tiny(client, "first-read")
        first = cache.counters()
        assert first["misses"] == 1 and first["source_bytes"] > 0
        run_tiny(client, "cached-read")
        second = cache.counters()
        assert second == {**first, "hits": first["hits"] + 1}  # no byte more read from the source
        assert cache.stats().entries == 1

        deadline = time.monotonic() + 90  # the keeper looks every 2 s, the server asks every 10 s
        shown = []
        while time.monotonic() < deadline and not shown:
            shown = [c for c in client.cluster().data_cache if c.hits >= 1]
            time.sleep(1)
    assert shown, "GET /v1/cluster never showed the node's cache"
    assert (shown[0].entries, shown[0].cap_bytes, shown[0].misses) == (1, CAP, 1)
    assert shown[0].bytes == cache.stats().bytes
