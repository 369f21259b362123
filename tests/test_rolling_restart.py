"""A rolling restart behind the proxy loses nothing: two real ``raydock serve`` replicas on
one real PostgreSQL behind HAProxy running docker/haproxy.cfg itself, clients reading and
submitting through it while each replica in turn stops gracefully and starts again: no
request fails, every accepted submit is in the store once and none twice. Long (about a
minute of restarts; opt-in with RAYDOCK_LONG_TESTS=1); needs ``haproxy`` on PATH. Its
figures are ``python -m bench.rolling_restart``'s."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.proxy import Proxy
from bench.harness.replicas import replica
from bench.harness.rolling import TTL_S, Load, restart_all
from bench.harness.waiting import wait_for
from tests.support.docker_files import find_tool

pytestmark = pytest.mark.long


def test_a_rolling_restart_behind_the_proxy_loses_no_request(tmp_path, postgres_server):
    if find_tool("haproxy") is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    name = postgres_server.create_database()
    servers, proxy, load = [], None, None
    try:
        servers = [replica(tmp_path / n, postgres_server.url(name), TTL_S) for n in ("a", "b")]
        proxy = Proxy(tmp_path, [s.port for s in servers]).start()
        wait_for(lambda: proxy.up() == {"r0", "r1"}, 60, "the proxy sends both replicas requests", 0.1)
        load = Load(proxy.url, clients=3).start()
        restart_all(servers, proxy)
        load.stop()
        print(f"\n{dict(load.sent)} requests through a rolling restart; failed: {load.failed[:5]}")
        assert load.failed == []
        assert load.sent["submit"] > 0 and load.sent["list"] > 0
        total = httpx.get(f"{servers[0].url}/v1/jobs", params={"limit": 1}, timeout=30).json()["total"]
        assert total == len(load.accepted) == len(set(load.accepted))
        for job_id in load.accepted:
            assert httpx.get(f"{servers[1].url}/v1/jobs/{job_id}", timeout=30).status_code == 200
    finally:
        if load is not None:
            load.stop()
        for server in servers:
            server.kill()
        if proxy is not None:
            proxy.stop()
        postgres_server.drop_database(name)
