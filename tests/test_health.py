"""GET /healthz and GET /livez of real ``raydock serve`` replicas on one real PostgreSQL:
readiness follows the store (a standby holding no lease is ready; Ray not answering leaves
it ready), the units each replica runs are named, nothing else is said (no host, no
process, no setting) and anyone may ask, of a server with a token too; liveness asks
nothing of the store. Whether Ray
answers is checked against the session's Ray head."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.jobstore import dead_ray
from bench.harness.replicas import LEASED, holder_of, replica
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for

TTL_S = 3.0
KEYS = {"status", "store", "ray", "leases"}
TOKEN = "health-test-token-5e1a"


def health(server: ServerProcess) -> tuple[int, dict]:
    r = httpx.get(server.url + "/healthz", timeout=10)
    return r.status_code, r.json()


@pytest.fixture
def store(postgres_server):
    name = postgres_server.create_database()
    yield postgres_server, name
    postgres_server.drop_database(name)


def test_healthz_names_the_units_each_replica_runs_and_readiness_follows_the_store(tmp_path, store):
    pg, name = store
    servers = []
    try:
        a = replica(tmp_path / "a", pg.url(name), TTL_S)
        servers.append(a)
        wait_for(lambda: health(a)[1]["leases"] == LEASED, 30, "the first replica runs every leased unit", 0.1)
        # B has an API token: its health is still answered to anyone, its listing is not.
        env = {"RAYDOCK_DATABASE_URL": pg.url(name), "RAYDOCK_LEASE_TTL_S": str(TTL_S)}
        b = ServerProcess(tmp_path / "b", dead_ray(), token=TOKEN, extra_env=env).start()
        servers.append(b)
        code, body = health(a)
        assert (code, body) == (200, {"status": "ok", "store": True, "ray": False, "leases": LEASED})
        # The standby holds nothing and is as ready: it serves every route.
        assert health(b) == (200, {"status": "ok", "store": True, "ray": False, "leases": []})
        host, pid = holder_of(a).split("/")[:2]
        assert host not in str(body) and pid not in str(body)
        assert TOKEN not in str(health(b)) and str(tmp_path) not in str(health(b))
        assert httpx.get(b.url + "/v1/replicas", timeout=10).status_code == 401

        pg.drop_database(name)  # the store is gone under both
        for server in servers:
            wait_for(lambda s=server: health(s)[0] == 503, 30, "healthz says the store does not answer", 0.1)
            code, body = health(server)
            assert code == 503 and set(body) == KEYS
            assert body["status"] == "unavailable" and body["store"] is False
            # Liveness asks nothing of the store: no replica is restarted for the database's outage.
            live = httpx.get(server.url + "/livez", timeout=10)
            assert (live.status_code, live.json()) == (200, {"status": "ok"})
    finally:
        for server in servers:
            server.kill()


def test_healthz_says_ray_answers(server):
    code, body = health(server)
    assert code == 200 and body["ray"] is True and body["store"] is True
