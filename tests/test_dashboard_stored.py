"""The dashboard's pages over stored jobs in a real headless Chromium, with no Ray cluster
(the server points at an address where nothing listens): the token login, a job's log with
its event lines, and a search's trial start-up and worker groups."""

from __future__ import annotations

import time

import httpx
import pytest

from api.schemas.events import MetricEvent, StartedEvent, event_line
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import free_ports
from service.db.models import JobRow, utcnow
from service.events import logs
from tests.support.browser import Tab

pytestmark = pytest.mark.slow
pytest.importorskip("playwright.sync_api")

TOKEN = "dashboard-test-token-7f3a"


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
