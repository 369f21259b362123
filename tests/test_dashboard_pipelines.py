"""The pipelines pages in a real headless Chromium, over a server with no Ray cluster (its
steps wait or queue; a cancel ends them): the list links to a pipeline, whose graph draws
every step with its status and every edge (init_from dashed), and whose cancel button asks
first and then ends every step, the graph showing it."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from tests.support.browser import WAIT_MS

pytestmark = pytest.mark.slow
pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("pipelines-dash"), dead_ray()).start()
    yield proc
    proc.stop()


def test_the_pipeline_page_draws_its_graph_and_cancels_it(server, tab):
    body = {
        "name": "nightly-chain",
        "steps": [
            {"name": "prepare", "job": digits_spec(name="prepare")},
            {"name": "pretrain", "job": digits_spec(name="pretrain"), "after": [{"step": "prepare"}]},
            {"name": "finetune", "job": digits_spec(name="finetune"), "init_from": {"step": "pretrain"}},
            {
                "name": "evaluate",
                "job": digits_spec(name="evaluate"),
                "after": [{"step": "finetune"}, {"step": "pretrain"}],
            },
            {"name": "alert", "job": digits_spec(name="alert"), "after": [{"step": "pretrain", "status": "FAILED"}]},
        ],
    }
    made = httpx.post(server.url + "/v1/pipelines", json=body, timeout=30)
    assert made.status_code == 202, made.text
    pipeline = made.json()
    page = tab.page
    page.goto(server.url + "/pipelines")
    page.locator(f'tr[data-pipeline="{pipeline["id"]}"] a').click()
    graph = page.locator("svg.pipeline-graph")
    graph.wait_for()
    assert page.get_by_role("link", name="Pipelines").get_attribute("aria-current") == "page"
    drawn = {g.get_attribute("data-step"): g.get_attribute("data-status") for g in graph.locator("g.step").all()}
    assert drawn == {
        "prepare": "QUEUED",
        "pretrain": "WAITING",
        "finetune": "WAITING",
        "evaluate": "WAITING",
        "alert": "WAITING",
    }
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to")) for e in graph.locator("g.pipeline-edge").all()}
    assert edges == {
        ("prepare", "pretrain"),
        ("pretrain", "finetune"),
        ("finetune", "evaluate"),
        ("pretrain", "evaluate"),
        ("pretrain", "alert"),
    }
    assert graph.locator('g[data-to="finetune"] path').get_attribute("stroke-dasharray")  # init_from: dashed
    assert graph.locator('g[data-to="alert"] text').text_content() == "on FAILED"
    # Columns by depth: each step right of the steps it runs after.
    x = {n: float(graph.locator(f'g[data-step="{n}"] rect').get_attribute("x")) for n in drawn}
    assert x["prepare"] < x["pretrain"] < x["finetune"] < x["evaluate"] and x["alert"] == x["finetune"]
    tab.shot("pipeline-graph")

    page.get_by_role("button", name="Cancel pipeline").click()
    page.locator("#confirm-ok").click()
    page.locator("h1 .badge", has_text="CANCELLED").wait_for(timeout=WAIT_MS)
    graph.locator('g.step[data-step="evaluate"][data-status="CANCELLED"]').wait_for(timeout=WAIT_MS)
    statuses = {s["status"] for s in httpx.get(f"{server.url}/v1/pipelines/{pipeline['id']}").json()["steps"]}
    assert statuses == {"CANCELLED"}
    tab.shot("pipeline-cancelled")
