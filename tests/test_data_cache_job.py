"""The dataset cache on the session's Ray cluster: a server with the cache on runs one tiny
built-in job twice; the first reads digits from its source, the second from the node's
cache (the cache's own counters), and ``GET /v1/cluster`` and the dashboard's cluster page
(a real headless Chromium, a screenshot) show the node's cache as its keeper reports it."""

from __future__ import annotations

import shutil
import time

import pytest

from api.client import Client
from bench.harness.servers import ServerProcess
from tests.support.browser import browser, tab  # noqa: F401 - fixtures
from tests.support.specs import BASE
from trainers.data.cache import DataCache

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
    shutil.rmtree(cache_dir, ignore_errors=True)  # and the node's keeper leaves with it


def run_tiny(client: Client, name: str) -> None:
    job = client.submit({**BASE, "name": name, "max_steps": 2})
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error


@pytest.mark.long  # a server of its own and two jobs: opt-in, for the default suite's time
def test_a_second_job_reads_its_dataset_from_the_node_cache(cache_server, tab):  # noqa: F811
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

    page = tab.page
    page.goto(server.url + "/cluster")
    page.get_by_role("heading", name="Dataset cache").wait_for()
    row = page.locator("tr", has_text=shown[0].node_id[:12]).filter(has_text="64.0 MiB")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "1" and cells[3] == "64.0 MiB", cells  # one dataset, the cap
    tab.shot("cluster-data-cache")
