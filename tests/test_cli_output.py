"""What a person sees in the terminal: ``raydock status`` as a summary, ``list`` within 80
columns, ``trials`` with the best trial marked, and a failed request told in one or two
lines with no traceback (``--debug`` shows it).

The CLI runs in-process through typer's CliRunner (no interpreter start per call) against
real servers over real HTTP; one case runs the real ``python -m service.cli`` entrypoint.
The slow cases share one tiny training job and one tiny search, submitted together."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from api.client import Client, Job
from api.errors import Conflict, InvalidSpec, NotFound, RaydockError, Unauthorized
from api.schemas import CheckpointPublic, JobPublic
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cli import app
from service.cli.common import console, err
from service.cli.errors import explain
from service.cli.listing import jobs_table
from service.cli.status import summary
from service.cluster.local_cluster import free_ports
from tests.support.specs import BASE, search

WIDTH = 80
TOKEN = "cli-output-token"
SEARCH = search(
    name="cli-trials",
    base={**BASE, "model": {"type": "mlp", "hidden_sizes": [16]}},
    search_space={"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
    num_trials=2,
    max_concurrent_trials=2,
    budget={"epochs": 1},
    driver_cpus_per_trial=0.25,
)


def cli(*args: str, url: str | None = None, token: str | None = None, width: int = WIDTH):
    """The CLI in this process, its consoles as wide as a terminal of ``width`` columns."""
    console.width = err.width = width
    env = {"RAYDOCK_API_TOKEN": token, "RAYDOCK_URL": url, "RAYDOCK_DEBUG": None}
    return CliRunner().invoke(app, list(args), env=env)


def closed_url() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there


# ----------------------------------------------------------------------------- no server


def test_unreachable_server_is_two_lines_that_say_what_to_do():
    url = closed_url()
    out = cli("status", "j123", url=url)
    assert out.exit_code == 1
    assert out.stderr.splitlines() == [
        f"error: Cannot reach the raydock server at {url}.",
        "Start one with `raydock serve`, or point --url / RAYDOCK_URL at a running one.",
    ]
    assert out.stdout == ""


def test_debug_lets_the_traceback_through():
    out = cli("--debug", "list", url=closed_url())
    assert out.exit_code != 0
    assert type(out.exception).__name__ == "ConnectError"  # re-raised, so the traceback is printed
    assert "Cannot reach" not in out.stderr


def test_each_refusal_says_what_to_do_in_one_or_two_lines():
    url = "http://10.0.0.5:8000"
    busy = RaydockError("Too many requests", code="rate_limited", status=429)
    busy.retry_after_s = 3.0
    invalid = InvalidSpec(
        "The job spec is invalid. epochs: must be >= 1; model.type: unknown",
        details=[{"loc": "epochs", "msg": "must be >= 1"}, {"loc": ["model", "type"], "msg": "unknown"}],
    )
    cases = {
        "wrong token": (Unauthorized("bad token"), True),
        "no token": (Unauthorized("token required"), False),
        "busy": (busy, False),
        "no job": (NotFound("No job 'j1'.", code="job_not_found"), False),
        "finished": (Conflict("Job j1 already ended (SUCCEEDED); nothing to cancel.", code="job_finished"), False),
        "invalid": (invalid, False),
    }
    told = {name: explain(exc, url, token_set) for name, (exc, token_set) in cases.items()}
    assert told["wrong token"] == (
        [
            f"The server at {url} refused the API token (401).",
            "Set --token or RAYDOCK_API_TOKEN to a live token (raydock token create).",
        ],
        1,
    )
    assert told["no token"][0][0] == f"The server at {url} needs an API token (401)."
    assert told["busy"][0][1] == "Try again in 3 s."
    assert told["no job"] == (["No job 'j1'.", "`raydock list` shows the jobs there are."], 1)
    assert told["finished"] == (["Job j1 already ended (SUCCEEDED); nothing to cancel. [job_finished]"], 1)
    # A validation message that lists its fields is cut to its head, each field on a line.
    assert told["invalid"] == (
        ["The job spec is invalid. [invalid_spec]", "  epochs: must be >= 1", "  model.type: unknown"],
        2,
    )
    assert all(1 <= len(lines) <= 3 for lines, _ in told.values())


def test_jobs_table_fits_80_columns_with_long_names_and_reasons():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
    jobs = [
        JobPublic(
            id=f"j{i:011x}",
            name="a-very-long-job-name-that-would-wrap-" * 2,
            kind="train",
            status="QUEUED" if i % 2 else "RUNNING",
            status_reason="waiting for resources: needs 64 CPUs / 8 GPUs, 2 / 0 free " * 2,
            queue_position=i if i % 2 else None,
            spec={"kind": "train", "epochs": 10_000},
            created_at=now - timedelta(days=i),
            started_at=None if i % 2 else now - timedelta(hours=30),
            latest_metrics={"epoch": 9_999, "train_loss": 0.123456},
            labels={"team": "x" * 60},
        )
        for i in range(12)
    ]
    console = Console(width=WIDTH, record=True, file=open(os.devnull, "w"))
    console.print(jobs_table(jobs, WIDTH, now))
    lines = console.export_text().splitlines()
    assert len(lines) == 2 + len(jobs)  # a header, its rule, one line per job: nothing wrapped
    assert max(len(line.rstrip()) for line in lines) <= WIDTH
    assert all(j.id in line for j, line in zip(jobs, lines[2:]))  # ids are never cut
    assert "QUEUED #1" in lines[3] and "epoch 9999/10000" in lines[2] and "1d06h" in lines[2]


def test_status_summary_shows_start_phases_and_the_first_lines_of_an_error():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
    job = JobPublic(
        id="jfeedbeef001",
        name="boom",
        kind="train",
        status="FAILED",
        status_reason="the training code raised an error",
        failure_cause="USER_CODE",
        error="ValueError: lr [0.5] is out of range\n" + "\n".join(f'  File "x.py", line {i}' for i in range(20)),
        spec={"kind": "train", "epochs": 5},
        created_at=now - timedelta(minutes=3),
        started_at=now - timedelta(minutes=2),
        finished_at=now - timedelta(seconds=55),
        attempt=2,
        latest_metrics={"epoch": 2, "val_acc": 0.5},
        restarts=[{"attempt": 1, "at": 0, "reason": "worker rank 1 died"}],
        restarts_total=1,
    )
    ckpt = CheckpointPublic(id=7, path="/s/ckpt", epoch=2, step=40, created_at=now)
    phases = {"queued": 0.2, "driver_started": 3.75, "first_metric": None}
    console = Console(width=WIDTH, record=True, file=open(os.devnull, "w"))
    console.print(summary(job, [ckpt], start_phases=phases, now=now))
    text = console.export_text()
    assert text.splitlines()[0] == "boom  jfeedbeef001  (train)"
    for part in (
        "FAILED  the training code raised an error",
        "epoch 2/5",
        "1m05s",
        "2 attempts, 1 worker-group restart",
        "worker rank 1 died",
        "val_acc=0.5",
        "1; latest id 7 at epoch 2, step 40",
        "queued 0.2s, driver_started 3.8s, first_metric -",
        "USER_CODE",
        "ValueError: lr [0.5] is out of range",  # brackets are text, not rich markup
        "15 more lines: raydock status jfeedbeef001 --json",
    ):
        assert part in text, part
    assert '"x.py", line 4' in text and '"x.py", line 5' not in text  # the first lines only
    assert max(len(line.rstrip()) for line in text.splitlines()) <= WIDTH


# ----------------------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def finished(server) -> tuple[Job, Job]:
    """A tiny training job and a tiny search, run at the same time, both finished."""
    with Client(server.url) as client:
        job = client.submit(digits_spec(name="cli-status", epochs=2, labels={"suite": "cli-output"}))
        search = client.submit(SEARCH)
        # Generous: on a busy 2-core host a 20-second job can take minutes.
        job.wait(timeout=600)
        search.wait(timeout=600)
        yield job, search


def test_status_of_a_finished_job_is_a_summary_and_json_is_the_record(server, finished):
    job, _ = finished
    assert job.status.value == "SUCCEEDED", job.info.error
    out = cli("status", job.id, url=server.url)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0] == f"cli-status  {job.id}  (train)"
    for part in ("SUCCEEDED", "epoch 2/2", "1 attempt, 0 worker-group restarts", "val_acc=", "2; latest id"):
        assert part in out.stdout, part
    assert max(len(line.rstrip()) for line in lines) <= WIDTH
    as_json = cli("status", job.id, "--json", url=server.url)
    assert JobPublic.model_validate_json(as_json.stdout) == job.refresh().info


def test_list_lines_fit_80_columns(server, finished):
    job, search = finished
    out = cli("list", "--limit", "20", url=server.url)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= WIDTH
    assert any(line.startswith(job.id) and "epoch 2/2" in line for line in lines)
    assert any(line.startswith(search.id) and "SUCCEEDED" in line for line in lines)


def test_trials_table_marks_the_best_trial(server, finished):
    _, search = finished
    assert search.status.value == "SUCCEEDED", search.info.error
    best = search.best()
    out = cli("trials", search.id, url=server.url)
    assert out.exit_code == 0, out.output
    rows = {t.trial_id: line for t in search.trials() for line in out.stdout.splitlines() if t.trial_id in line}
    assert len(rows) == 2
    assert rows[best.trial_id].lstrip().startswith("★")
    assert all(not line.lstrip().startswith("★") for t, line in rows.items() if t != best.trial_id)
    assert max(len(line.rstrip()) for line in out.stdout.splitlines()) <= WIDTH
    as_json = cli("trials", search.id, "--json", url=server.url)
    assert yaml.safe_load(as_json.stdout)["best"]["trial_id"] == best.trial_id


def test_refused_spec_names_the_field(server, tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text(yaml.safe_dump(digits_spec(name="too-big", scaling={"num_workers": 64})))
    out = cli("submit", str(spec), url=server.url)
    assert out.exit_code == 2
    assert out.stderr.startswith("error: The job asks for 64 workers")
    assert "  scaling.num_workers: exceeds cluster capacity" in out.stderr.splitlines()
    assert "Traceback" not in out.output


@pytest.mark.slow
def test_wrong_or_missing_token_is_two_lines_from_the_real_entrypoint(tmp_path):
    # A server with a token whose Ray is nowhere: nothing here runs a job.
    server = ServerProcess(tmp_path / "srv", closed_url(), token=TOKEN).start()
    try:
        wrong = subprocess.run(
            [sys.executable, "-m", "service.cli", "list"],
            env={**os.environ, "RAYDOCK_URL": server.url, "RAYDOCK_API_TOKEN": "nope", "COLUMNS": str(WIDTH)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        missing = cli("list", url=server.url)
        # Every command that calls the server tells a refusal the same way.
        others = {
            args: cli(*args, url=server.url, token="nope")
            for args in (
                ("pipeline", "list"),
                ("pipeline", "status", "p1"),
                ("schedule", "list"),
                ("quota", "show", "default"),
                ("events", "j1"),
            )
        }
        dashboard = cli("ui", url=server.url, token=TOKEN)
    finally:
        server.stop()
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.splitlines() == [
        f"error: The server at {server.url} refused the API token (401).",
        "Set --token or RAYDOCK_API_TOKEN to a live token (raydock token create).",
    ]
    for args, out in others.items():
        assert (out.exit_code, out.stderr.splitlines()) == (1, wrong.stderr.splitlines()), args
    assert missing.exit_code == 1 and len(missing.stderr.splitlines()) == 2
    assert missing.stderr.startswith(f"error: The server at {server.url} needs an API token (401).")
    assert dashboard.exit_code == 0 and dashboard.stdout == server.url + "/\n"  # the token never in the URL


def test_the_progress_bar_counts_what_the_job_reports():
    from api.schemas import JobPublic, TuneSpec
    from service.cli.format import length, progress
    from service.cli.main import _where

    assert _where({"epoch": 3, "step": 120, "loss": 0.5}) == "epoch 3 step 120"
    assert _where({"step": 40}) == "step 40"
    assert _where({"training_iteration": 7, "loss": 0.1}) == "report 7"  # a Tune function's reports
    spec = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "examples", "tune-function-pbt.yaml")))
    assert length(TuneSpec.model_validate(spec).model_dump(mode="json")) == ("training_iteration", 20)
    # `raydock list` and `status` read the stored spec the same way: a search's reports budget has a total.
    assert length(spec) == ("training_iteration", 20)
    assert length({"kind": "tune", "budget": {"epochs": 8}}) == ("epoch", 8)
    assert length({"kind": "train", "epochs": 5, "max_steps": 300}) == ("step", 300)
    stored = {"id": "j1", "name": "s", "kind": "tune", "status": "RUNNING", "created_at": "2026-11-28T10:00:00Z"}
    stored.update(spec=spec, latest_metrics={"training_iteration": 7, "loss": 0.2})
    assert progress(JobPublic.model_validate(stored)) == "report 7/20"
