"""The cluster page's replicas in a real headless Chromium: two real ``raydock serve``
replicas on one real PostgreSQL (their Ray address answers nothing), signed in as the
server admin: each replica's id, host, start and last claim, the units it runs and for
how long; after the holder is SIGKILLed, the survivor runs them all and the dead one is
marked gone. A user who is not a server admin gets no replicas panel and the page never
asks for the listing. Screenshots go where tests/test_dashboard.py puts its own."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.jobstore import dead_ray
from bench.harness.replicas import LEASED
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for
from tests.support.browser import WAIT_MS, Tab

pytestmark = pytest.mark.slow

TOKEN = "replicas-dashboard-token-2c9d"
TTL_S = 3.0


def _replica(data_dir, url: str) -> ServerProcess:
    env = {"RAYDOCK_DATABASE_URL": url, "RAYDOCK_LEASE_TTL_S": str(TTL_S)}
    return ServerProcess(data_dir, dead_ray(), token=TOKEN, extra_env=env).start()


def _sign_in(tab: Tab, url: str, token: str) -> None:
    page = tab.page
    page.goto(url + "/cluster")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Cluster").wait_for()


def test_the_cluster_page_shows_the_replicas_and_the_units_each_runs(browser, tmp_path, postgres_server):  # noqa: F811
    name = postgres_server.create_database()
    url = postgres_server.url(name)
    admin = {"Authorization": f"Bearer {TOKEN}"}
    servers, tabs = [], []
    try:
        a = _replica(tmp_path / "a", url)
        servers.append(a)
        b = _replica(tmp_path / "b", url)
        servers.append(b)
        listing = httpx.get(a.url + "/v1/replicas", headers=admin, timeout=10).json()
        a_id = next(r["id"] for r in listing["replicas"] if r["id"].split("/")[1] == str(a.proc.pid))
        wait_for(lambda: _held_by(a, a_id), 30, "the first replica runs every unit", 0.1)

        tab = Tab(browser)
        tabs.append(tab)
        tab.expected.append("status of 503")  # GET /v1/cluster: no Ray answers there
        page = tab.page
        page.set_default_timeout(WAIT_MS)
        _sign_in(tab, b.url, TOKEN)
        a_row = page.locator(f'tr[data-replica="{a_id}"]')
        a_row.wait_for()
        b_id = next(r["id"] for r in _listing(b)["replicas"] if r["id"].split("/")[1] == str(b.proc.pid))
        b_row = page.locator(f'tr[data-replica="{b_id}"]')
        b_row.wait_for()
        host = a_id.split("/")[0]
        assert a_row.locator("td").nth(1).inner_text() == host
        assert sorted(a_row.locator("[data-lease]").evaluate_all("els => els.map(e => e.dataset.lease)")) == LEASED
        assert "ago" in a_row.locator("td").nth(3).inner_text()
        assert "standby" in b_row.inner_text()
        tab.shot("cluster-replicas")

        a.kill()  # the holder dies: the survivor takes every unit, and the page says so
        b_row.locator("[data-lease]").nth(len(LEASED) - 1).wait_for()
        a_row.locator(".badge", has_text="gone").wait_for()
        assert a_row.locator("td").nth(4).inner_text() == "none"
        assert "standby" not in b_row.inner_text()
        assert sorted(b_row.locator("[data-lease]").evaluate_all("els => els.map(e => e.dataset.lease)")) == LEASED
        tab.shot("cluster-replicas-takeover")
        assert tab.unexpected() == []

        # A user who is not a server admin: no panel, and the listing is never asked for.
        httpx.post(b.url + "/v1/projects", json={"name": "web"}, headers=admin).raise_for_status()
        httpx.post(b.url + "/v1/users", json={"name": "ann", "project": "web"}, headers=admin).raise_for_status()
        ann = httpx.post(b.url + "/v1/users/ann/tokens", json={}, headers=admin).json()["token"]
        user = Tab(browser)
        tabs.append(user)
        user.expected.append("status of 503")
        asked: list[str] = []
        user.page.on("request", lambda r: asked.append(r.url))
        _sign_in(user, b.url, ann)
        user.page.get_by_text("No job is waiting").wait_for()  # drawn with the panel's verdict
        assert not user.page.locator(".panel h2", has_text="Replicas").is_visible()
        assert not [u for u in asked if "/v1/replicas" in u]
        assert any(u.endswith("/v1/me") for u in asked)
        assert user.unexpected() == []
    finally:
        for t in tabs:
            t.context.close()
        for server in servers:
            server.kill()
        postgres_server.drop_database(name)


def _listing(server: ServerProcess) -> dict:
    r = httpx.get(server.url + "/v1/replicas", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    r.raise_for_status()
    return r.json()


def _held_by(server: ServerProcess, holder: str) -> bool:
    held = {x["name"]: x["holder"] for x in _listing(server)["leases"] if x["expires_in_s"] > 0}
    return all(held.get(n) == holder for n in LEASED)
