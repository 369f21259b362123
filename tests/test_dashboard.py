"""The web dashboard in a real headless Chromium (Debian's, driven by Playwright): the jobs
table, a job's live chart, log and checkpoint download, cancel from the page, a PBT
search's lineage graph, the cluster page, the schedules page, and a deep link reloaded
(pages over stored jobs with no cluster: tests/test_dashboard_stored.py).

One server for the module on the session's Ray cluster, tiny jobs (one worker, a few
steps). Every test fails on any console error or uncaught page error (the browser and its
tabs: tests/support/browser.py)."""

from __future__ import annotations

import io
import tarfile
from datetime import datetime

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from api.client import Client
from bench.harness.servers import ServerProcess
from service.cli import app as cli
from tests.support.browser import WAIT_MS
from tests.support.specs import BASE, search, user_spec

pytestmark = pytest.mark.slow
pytest.importorskip("playwright.sync_api")

TOKEN = "dashboard-test-token-7f3a"
STEPS = 30  # reports of the live job: 15 s of them, so the page sees them arrive


@pytest.fixture(scope="module")
def dash(ray_head, tmp_path_factory) -> ServerProcess:
    proc = ServerProcess(tmp_path_factory.mktemp("dashboard"), ray_head.dashboard_url).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sdk(dash) -> Client:
    with Client(dash.url) as c:
        yield c


def points_drawn(page, metric: str) -> int:
    value = page.get_attribute(f'figure[data-metric="{metric}"]', "data-points")
    return int(value or 0)


def test_a_job_page_charts_live_follows_the_log_downloads_a_checkpoint_and_reloads(dash, sdk, tab, tmp_path):
    spec = user_spec(
        "userpkg.ckpt_steps:train",
        name="dash-live",
        labels={"team": "ui"},
        config={"steps": STEPS, "sleep_s": 0.5, "every": 10},
        scaling={"num_workers": 1},
    )
    # Submitted from the CLI, as a user would, then watched in the browser.
    spec_file = tmp_path / "live.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    submitted = CliRunner().invoke(cli, ["submit", str(spec_file), "--url", dash.url])
    assert submitted.exit_code == 0, submitted.output
    job = sdk.job(submitted.output.split()[-1])
    page = tab.page

    page.goto(dash.url + "/")
    row = page.locator(f'tr[data-job="{job.id}"]')
    row.wait_for()
    assert "team=ui" in row.inner_text()
    tab.shot("jobs")

    row.get_by_role("link", name="dash-live").click()
    page.wait_for_url(f"**/jobs/{job.id}")
    page.evaluate("window.sameDocument = true")  # gone if the page reloads
    page.wait_for_function(
        "() => +document.querySelector('figure[data-metric=loss]')?.dataset.points > 0", timeout=WAIT_MS
    )
    first = points_drawn(page, "loss")
    assert first < STEPS
    page.wait_for_function(
        f"() => +document.querySelector('figure[data-metric=loss]').dataset.points === {STEPS}", timeout=WAIT_MS
    )
    assert page.evaluate("window.sameDocument") is True  # the rest came over the stream, not by reloading

    page.locator("#log").filter(has_text="Running entrypoint for job").wait_for(timeout=WAIT_MS)
    page.fill("#log-search", "entrypoint")
    page.locator("#log mark").first.wait_for()
    assert "matching line" in page.inner_text("#log-info")
    page.fill("#log-search", "")

    page.locator("h1 .badge", has_text="SUCCEEDED").wait_for(timeout=WAIT_MS)
    assert points_drawn(page, "loss") == STEPS
    download_button = page.get_by_role("button", name="Download checkpoint").first
    download_button.wait_for()
    with page.expect_download() as info:
        download_button.click()
    saved = tmp_path / "ckpt.tar.gz"
    info.value.save_as(saved)
    with tarfile.open(saved) as archive:
        assert any(name.endswith("state.pt") for name in archive.getnames())
    # Where the start-up went: every phase the job reached, in order, seconds after the POST.
    phases = page.locator("section.panel", has_text="Start-up phases")
    phases.locator("td", has_text="first_metric").wait_for(timeout=WAIT_MS)
    shown = [c.strip() for c in phases.locator("tbody tr td:first-child").all_inner_texts()]
    assert shown == list(job.refresh().info.start_phases) and shown[0] == "queued" and shown[-1] == "first_metric"
    tab.shot("job")

    page.reload()  # the deep link is served the app, which draws the stored series
    page.locator("h1", has_text="dash-live").wait_for()
    page.wait_for_function(f"() => +document.querySelector('figure[data-metric=loss]')?.dataset.points === {STEPS}")
    assert page.evaluate("window.sameDocument") is None


def test_cancel_from_the_job_page_asks_first_then_cancels(dash, sdk, tab):
    job = sdk.submit(user_spec("userpkg.steps:train", name="dash-cancel", config={"steps": 10_000, "sleep_s": 0.2}))
    page = tab.page
    page.goto(f"{dash.url}/jobs/{job.id}")
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    cancel.click()
    page.keyboard.press("Escape")  # the dialog's no: nothing happens
    assert not page.locator("#confirm").is_visible()
    assert sdk.job(job.id).status.value not in ("CANCELLING", "CANCELLED")

    cancel.focus()  # from here by keyboard alone
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.textContent") == "Keep it"  # the safe answer first
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.locator("h1 .badge", has_text="CANCEL").wait_for()
    assert sdk.job(job.id).status.value in ("CANCELLING", "CANCELLED")
    page.locator("h1 .badge", has_text="CANCELLED").wait_for(timeout=WAIT_MS)
    tab.shot("job-cancelled")


def test_cluster_page_shows_nodes_capacity_and_queue(dash, tab):
    page = tab.page
    page.goto(dash.url + "/cluster")
    page.get_by_role("heading", name="Nodes").wait_for()
    page.locator("td", has_text="head").first.wait_for()
    assert "CPUs free" in page.inner_text(".cards")
    page.get_by_role("heading", name="Dataset cache").wait_for()  # each node's, as its keeper reports it
    tab.shot("cluster")
    page.emulate_media(color_scheme="dark")  # the system's dark setting: the dark palette
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(15, 18, 22)", background
    tab.shot("cluster-dark")


def test_a_pbt_search_draws_its_lineage_and_shows_the_best_replay(dash, sdk, tab):
    spec = search(
        name="dash-pbt",
        base={**BASE, "model": {"type": "mlp", "hidden_sizes": [16]}},
        search_space={"optimizer.lr": {"type": "loguniform", "low": 0.0005, "high": 0.5}},
        algorithm="pbt",
        pbt={"perturbation_interval": 1, "quantile_fraction": 0.5},
        num_trials=2,
        max_concurrent_trials=2,
        budget={"epochs": 3},
        seed=3,
    )
    job = sdk.submit(spec)
    job.wait(timeout=480)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert job.lineage(), "PBT recorded no exploit: the graph would have no edge"

    page = tab.page
    page.goto(f"{dash.url}/jobs/{job.id}")
    page.locator("tr[data-trial]").nth(1).wait_for()
    assert page.locator("tr[data-trial]").count() == 2
    page.locator("#lineage .edge").first.wait_for()
    assert page.locator("#lineage .node").count() == 2
    assert page.locator("#curves canvas").count() >= 1
    assert page.locator("#scatter circle.dot").count() == 2
    # Each trial's start-up, and every trial's Train runs among the search's worker groups.
    rows, restarts = (
        page.locator(f"#{box} tr[data-phase-trial]").count() for box in ("trial-phases", "exploit-phases")
    )
    assert rows - restarts == 2  # one start row a trial; a restart row each exploit, in its own table
    assert all(page.locator("#trial-phases tr[data-phase-trial] td").nth(i * 4 + 3).inner_text() for i in range(2))
    groups = page.locator("table", has=page.locator("th", has_text="Workers")).filter(
        has=page.locator("th", has_text="Trial")
    )
    assert {"trial 0", "trial 1"} <= set(groups.locator("tbody td").all_inner_texts())
    page.get_by_role("button", name="Show its replay spec").click()
    page.locator("#replay pre", has_text="kind: train").wait_for()
    tab.shot("search")


def test_an_unknown_page_and_an_unknown_api_path(dash, tab):
    page = tab.page
    page.goto(dash.url + "/no/such/page")
    page.get_by_text("No page at /no/such/page").wait_for()
    api = httpx.get(dash.url + "/v1/no-such-route")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
    assert httpx.post(dash.url + "/jobs").status_code == 404  # only GET answers the shell
    js = httpx.get(dash.url + "/ui/js/main.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert io.BytesIO(httpx.get(dash.url + "/ui/vendor/uplot/LICENSE").content).read().startswith(b"The MIT License")


def test_the_schedules_page_lists_next_firings_and_pauses_and_resumes(dash, sdk, tab):
    job = {"name": "retrain", "model": {"type": "mlp"}, "data": {"source": "digits"}, "epochs": 1}
    nightly = sdk.create_schedule({"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "job": job})
    hourly = sdk.create_schedule({"name": "hourly", "cron": "@hourly", "paused": True, "job": job})
    try:
        page = tab.page
        page.goto(dash.url + "/schedules")
        row = page.locator(f'tr[data-schedule="{nightly.id}"]')
        row.wait_for()
        assert page.get_by_role("link", name="Schedules").get_attribute("aria-current") == "page"
        assert "0 3 * * *" in row.inner_text() and "Europe/Berlin" in row.inner_text()
        shown = row.locator("td.next time").get_attribute("datetime")
        assert datetime.fromisoformat(shown.replace("Z", "+00:00")) == nightly.next_runs[0]
        assert "paused" in page.locator(f'tr[data-schedule="{hourly.id}"] td.next').inner_text()
        tab.shot("schedules")
        row.get_by_role("button", name="Pause nightly").click()
        row.get_by_role("button", name="Resume nightly").wait_for()
        assert sdk.schedule(nightly.id).paused
        page.get_by_role("button", name="Resume hourly").click()
        page.get_by_role("button", name="Pause hourly").wait_for()
        assert not sdk.schedule(hourly.id).paused
        tab.shot("schedules-after-toggles")
    finally:  # no tick of theirs may start a job on the session's cluster
        sdk.delete_schedule(nightly.id)
        sdk.delete_schedule(hourly.id)
