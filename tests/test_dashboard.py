"""The web dashboard in a real headless Chromium (Debian's, driven by Playwright): the jobs
table, a job's live chart, log and checkpoint download, cancel from the page, a PBT
search's lineage graph, the cluster page, the schedules page, the token login, and a deep link reloaded.

One server for the module on the session's Ray cluster, tiny jobs (one worker, a few
steps). Every test fails on any console error or uncaught page error; a screenshot of
each page goes to $RAYDOCK_TEST_ARTIFACTS (default /tmp/raydock-screenshots).
``tests/setup_browser.sh`` installs Chromium when it is missing."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from api.client import Client
from api.schemas.events import MetricEvent, StartedEvent, event_line
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from service.cli import app as cli
from service.cluster.local_cluster import free_ports
from service.db.models import JobRow, utcnow
from service.events import logs
from tests.support.specs import BASE, search, user_spec

pytestmark = pytest.mark.slow
playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("RAYDOCK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("RAYDOCK_TEST_ARTIFACTS") or "/tmp/raydock-screenshots")
TOKEN = "dashboard-test-token-7f3a"
WAIT_MS = 180_000
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


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run tests/setup_browser.sh (or set RAYDOCK_CHROMIUM)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Tab:
    """A page that records every console error and page error; ``expect`` names the
    errors a test provokes on purpose (a refused token's 401)."""

    def __init__(self, browser, **context):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True, **context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.expected: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(x in e for x in self.expected)]

    def shot(self, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture()
def tab(browser):
    t = Tab(browser)
    yield t
    t.context.close()
    assert t.unexpected() == [], "console errors"


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
    assert page.locator("#trial-phases tr[data-phase-trial]").count() == 2
    assert all(page.locator("#trial-phases tr[data-phase-trial] td").nth(i * 4 + 3).inner_text() for i in range(2))
    groups = page.locator("table", has=page.locator("th", has_text="Trial")).filter(has_text="trial 1")
    assert "trial 0" in groups.inner_text()
    page.get_by_role("button", name="Show its replay spec").click()
    page.locator("#replay pre", has_text="kind: train").wait_for()
    tab.shot("search")


def test_login_with_a_token_and_a_wrong_one_refused(browser, tmp_path):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # no cluster needed to sign in
    server = ServerProcess(tmp_path / "data", dead, token=TOKEN).start()
    t = Tab(browser)
    try:
        shell = httpx.get(server.url + "/jobs/j123")  # a page path: the shell, no token needed, no data
        assert shell.status_code == 200 and "text/html" in shell.headers["content-type"]
        assert "script-src 'self'" in shell.headers["content-security-policy"]
        assert httpx.get(server.url + "/v1/jobs").status_code == 401  # the data still needs it
        assert httpx.get(server.url + "/v1/no-such-route").json()["error"]["code"] == "unauthorized"

        page = t.page
        page.goto(server.url + "/")
        page.get_by_label("API token").wait_for()  # asked before any call: no 401 to get there
        t.shot("login")

        t.expected.append("status of 401")  # the refused token's answer, logged by the browser
        page.get_by_label("API token").fill("not-the-token")
        page.get_by_role("button", name="Sign in").click()
        page.locator("#login-error", has_text="refused").wait_for()
        assert page.evaluate("sessionStorage.getItem('raydock.token')") is None
        assert len(t.errors) == 1

        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Jobs").wait_for()
        assert page.evaluate("sessionStorage.getItem('raydock.token')") == TOKEN
        assert t.context.cookies() == [] and TOKEN not in page.url
        page.locator("#whoami", has_text="signed in as admin").wait_for()  # RAYDOCK_API_TOKEN is the admin
        page.reload()  # still signed in for this tab
        page.get_by_role("heading", name="Jobs").wait_for()
        t.shot("jobs-signed-in")

        # A user's own token signs in the same way, and the header says whose it is.
        admin = {"Authorization": f"Bearer {TOKEN}"}
        httpx.post(server.url + "/v1/projects", json={"name": "web"}, headers=admin).raise_for_status()
        httpx.post(server.url + "/v1/users", json={"name": "ann", "project": "web"}, headers=admin).raise_for_status()
        ann = httpx.post(server.url + "/v1/users/ann/tokens", json={}, headers=admin).json()["token"]
        page.get_by_role("button", name="Sign out").click()
        page.get_by_label("API token").fill(ann)
        page.get_by_role("button", name="Sign in").click()
        page.locator("#whoami", has_text="signed in as ann").wait_for()
        page.get_by_role("heading", name="Jobs").wait_for()
        assert t.unexpected() == []
    finally:
        t.context.close()
        server.stop()


# A finished job's log as its driver wrote it: the job's own lines among the event lines
# that report to the server (one of them with the prefix Ray puts on a worker's output).
JOB_LOG = "\n".join(
    [
        "Running entrypoint for job raysubmit_1",
        event_line(StartedEvent(type="started", seq=0, ts=1.0)),
        "epoch 1: loss 0.52",
        "(RayTrainWorker pid=4242) " + event_line(MetricEvent(type="metric", seq=0, ts=2.0, metrics={"loss": 0.52})),
        "epoch 2: loss 0.31",
        event_line(MetricEvent(type="metric", seq=1, ts=3.0, metrics={"loss": 0.31})),
        "done",
        "",
    ]
)


def test_the_job_log_shows_the_jobs_own_output_and_event_lines_on_request(browser, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'raydock.db'}"
    service = job_service(url, data)  # no cluster: the job and its log are put in the store
    job_id = submit(service, name="log-lines")
    with service.sessions.begin() as s:
        logs.append(s, s.get(JobRow, job_id), JOB_LOG, cap=1 << 20)
    set_columns(service, job_id, status="SUCCEEDED", finished_at=utcnow())
    server = ServerProcess(data, dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url}).start()
    t = Tab(browser)
    try:
        page = t.page
        page.goto(f"{server.url}/jobs/{job_id}")
        log = page.locator("#log")
        log.filter(has_text="done").wait_for()
        shown = log.inner_text()
        assert "epoch 1: loss 0.52" in shown and "epoch 2: loss 0.31" in shown
        assert "RAYDOCK_EVENT" not in shown
        assert page.inner_text("#log-info").startswith("3 event lines hidden")
        t.shot("job-log")

        page.fill("#log-search", "loss")  # a search looks at what is shown
        page.locator("#log mark").first.wait_for()
        assert page.inner_text("#log-info").startswith("2 matching lines")
        page.fill("#log-search", "")

        page.get_by_label("Show event lines").check()
        log.filter(has_text="RAYDOCK_EVENT").wait_for()
        assert log.inner_text().count("RAYDOCK_EVENT") == 3 and "(RayTrainWorker pid=4242)" in log.inner_text()
        assert page.inner_text("#log-info") == ""
        t.shot("job-log-events")
        assert t.unexpected() == []
    finally:
        t.context.close()
        server.stop()
        service.sessions.kw["bind"].dispose()


def test_a_searchs_page_shows_each_trials_start_up_and_restarts_and_its_trials_worker_groups(browser, tmp_path):
    from tests.test_trial_phases import search_job, trial_events

    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'raydock.db'}"
    service = job_service(url, data)  # no cluster: the search's events are taken in as its driver sends them
    job_id = search_job(service)
    service.ingest.take(job_id, trial_events(time.time()))
    set_columns(service, job_id, status="SUCCEEDED", finished_at=utcnow())
    server = ServerProcess(data, dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url}).start()
    t = Tab(browser)
    try:
        page = t.page
        page.goto(f"{server.url}/jobs/{job_id}")
        start = page.locator("#trial-phases tr[data-phase-trial]").first
        start.wait_for()
        assert start.locator("td").all_inner_texts() == ["trial 0", "4 s", "6 s", "8 s"]
        restart = page.locator("#exploit-phases tr[data-phase-trial]")
        assert restart.count() == 1
        assert restart.locator("td").all_inner_texts()[2:] == ["0.5 s", "3 s", "5 s", "6 s"]
        groups = page.locator("table", has=page.locator("th", has_text="Trial")).filter(has_text="10.0.0.7")
        groups.wait_for()
        assert groups.locator("tbody tr").count() == 2 and "trial 0" in groups.inner_text()
        t.shot("search-trial-phases")
        assert t.unexpected() == []
    finally:
        t.context.close()
        server.stop()
        service.sessions.kw["bind"].dispose()


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
