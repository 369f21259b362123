"""The ``raydock`` command line: ``serve`` runs the server; every other command is a
thin layer over the SDK (``api.client``) and takes the same YAML/JSON job spec."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from api.client import Client, Job
from api.errors import RaydockError
from api.schemas import REPORTS_UNIT, JobStatus, parse_job_spec
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, app, client_for, console, err, fail, need_server
from service.cli.events import events  # noqa: F401  (registers `raydock events`)
from service.cli.format import length, num, unit_word
from service.cli.gc import gc
from service.cli.listing import list_jobs
from service.cli.pipelines import pipeline_app  # noqa: F401  (registers `raydock pipeline`)
from service.cli.quota import quota_app  # noqa: F401  (registers `raydock quota`)
from service.cli.results import checkpoints, tensorboard, trials
from service.cli.schedules import schedule_app  # noqa: F401  (registers `raydock schedule`)
from service.cli.status import status
from service.cli.tenancy import projects, tokens, users
from service.cli.ui import ui
from service.code.upload_view import UploadView, describe


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="Listen address (default 127.0.0.1).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Listen port (default 8000).")] = None,
) -> None:
    """Run the API server (starts a local Ray head unless RAY_ADDRESS is set)."""
    need_server("serve")
    import uvicorn

    from service.http.app import create_app
    from service.http.connections import server_config
    from service.settings import Settings

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(http=overrides)
    uvicorn.Server(server_config(create_app(settings), settings, log_level="info")).run()


@app.command()
def run(
    spec_file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).", exists=True, dir_okay=False)],
    port: Annotated[Optional[int], typer.Option(help="Port for the embedded server (default: a free one).")] = None,
) -> None:
    """Run one job on an embedded raydock (server + local Ray + SQLite) and follow it to the end."""
    need_server("run")
    import threading

    import uvicorn

    from service.cluster.local_cluster import free_ports
    from service.http.app import create_app
    from service.http.connections import server_config
    from service.settings import CodeSettings, Settings

    spec = load_spec_file(spec_file)
    # The code a spec names lies beside it: that is what this one-off server may ship (unless RAYDOCK_CODE_ROOT says).
    code = CodeSettings()
    if not code.code_root:
        code = CodeSettings(code_root=str(spec_file.resolve().parent))
    settings = Settings(http={"host": "127.0.0.1", "port": port or free_ports(1)[0]}, code=code)
    server = uvicorn.Server(server_config(create_app(settings), settings, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    err.print(
        f"starting raydock on {settings.http.events_base_url} (data in {settings.storage.data_dir}; a local Ray head starts on first use)"
    )
    thread.start()
    try:
        with Client(settings.http.events_base_url, token=settings.auth.api_token) as client:
            _wait_healthy(client, server)
            err.print(f"cluster: {client.cluster().cpus_total:g} CPUs, {client.cluster().gpus_total:g} GPUs")
            job = client.submit(spec, base_dir=spec_file.parent)
            console.print(job.id)
            _follow(job, *length(spec.model_dump(mode="json")), exit_on_failure=False)
            for c in job.checkpoints()[-1:]:
                epoch = "" if c.epoch is None else f"epoch {c.epoch}, "
                console.print(f"latest checkpoint: id {c.id}, {epoch}{c.path}")
    finally:
        server.should_exit = True
        thread.join(60)
    if job.status != JobStatus.SUCCEEDED:
        raise typer.Exit(1)


def _wait_healthy(client: Client, server, timeout: float = 180.0) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.started:
            try:
                client.request("GET", "/healthz")
                return
            except (httpx.HTTPError, RaydockError):
                pass
        time.sleep(0.3)
    fail("the embedded server did not start; see the log above")


def load_spec_file(path: Path):
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {path}: {exc}")
    if not isinstance(raw, dict):
        fail(f"{path} must hold a mapping (the job spec)")
    try:
        return parse_job_spec(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        fail(f"{path} is not a valid job spec:\n" + "\n".join(lines), code=2)


@app.command()
def submit(
    spec_file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).", exists=True, dir_okay=False)],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Show live progress until the job ends.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Submit a job and print its id; --follow shows its progress until it ends.

    A user-code spec's working_dir (relative to the spec file) is packaged and uploaded once.
    Under --follow a large upload shows a progress bar."""
    spec = load_spec_file(spec_file)
    with client_for(url, token) as client:
        with UploadView(err, live=follow) as view:
            job = client.submit(spec, base_dir=spec_file.parent, progress=view)
        if client.last_upload is not None:
            err.print(describe(client.last_upload))
        console.print(job.id)
        if follow:
            _follow(job, *length(spec.model_dump(mode="json")))


def _where(m: dict) -> str:
    """``epoch 3 step 120`` (what the report has of them), else ``report 7`` (a Tune function's)."""
    where = " ".join(f"{unit} {m[unit]}" for unit in ("epoch", "step") if unit in m)
    return where or (f"{unit_word(REPORTS_UNIT)} {m[REPORTS_UNIT]}" if REPORTS_UNIT in m else "")


def _follow(job: Job, unit: str, total: int | None, exit_on_failure: bool = True) -> None:
    with Progress(
        TextColumn("[bold]{task.fields[status]}"),
        BarColumn(),
        TextColumn("{task.fields[where]}"),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
        console=err,
    ) as bar:
        task = bar.add_task("train", total=total, status="WAITING", where="", loss="")  # until the first report
        for point in job.stream_metrics():
            m = point.metrics
            done = m.get(unit)
            loss = m.get("train_loss", m.get("loss"))
            where = _where(m)
            extra = f"loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
            if isinstance(m.get("val_acc"), (int, float)):
                extra += f" val_acc {m['val_acc']:.3f}"
            bar.update(
                task,
                completed=done if isinstance(done, (int, float)) else None,
                status="RUNNING",
                where=where,
                loss=extra,
            )
        job.wait()
        bar.update(task, status=job.status.value)
    _print_outcome(job, exit_on_failure)


def _print_outcome(job: Job, exit_on_failure: bool = True) -> None:
    info = job.info
    reason = f" ({info.status_reason})" if info.status_reason else ""
    console.print(escape(f"{info.id} {info.status.value}{reason}"), highlight=False)
    if info.latest_metrics:
        console.print("final metrics: " + ", ".join(f"{k}={num(v)}" for k, v in info.latest_metrics.items()))
    if info.status == JobStatus.FAILED:
        cause = info.failure_cause.value if info.failure_cause else "FAILED"
        err.print(f"[red]{cause}[/red]: {escape(info.error or '')}")
    if info.status != JobStatus.SUCCEEDED and exit_on_failure:
        raise typer.Exit(1)


@app.command()
def logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Print a job's log; -f follows it until the job ends."""
    with client_for(url, token) as client:
        out = client.job(job_id).logs(follow=follow)
        if isinstance(out, str):
            sys.stdout.write(out)
        else:
            for chunk in out:
                sys.stdout.write(chunk)
                sys.stdout.flush()


@app.command()
def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="One job id or many.")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Cancel jobs (their workers and CPUs are released); many at once in one request per 1000."""
    with client_for(url, token) as client:
        if len(job_ids) == 1:
            job = client.job(job_ids[0]).cancel()
            console.print(f"{job.id} {job.status.value}")
            return
        result = client.cancel_many(job_ids)
    for refusal in result.refused:
        err.print(escape(f"{refusal.id}: {refusal.message}"))
    console.print(f"cancelled {len(result.cancelled)} of {len(job_ids)}")
    if result.refused:
        raise typer.Exit(1)


@app.command()
def resume(job_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Start a new attempt of a FAILED or CANCELLED job from its last checkpoint."""
    with client_for(url, token) as client:
        job = client.job(job_id).resume()
        console.print(escape(f"{job.id} {job.status.value} ({job.info.status_reason})"))


# Every command but the ones above lives in a module of its own: one line here each.
app.command("list")(list_jobs)
app.command()(status)
app.command()(checkpoints)
app.command()(tensorboard)
app.command()(trials)
app.command()(ui)
app.command()(gc)
app.add_typer(users, name="user")
app.add_typer(projects, name="project")
app.add_typer(tokens, name="token")


if __name__ == "__main__":
    app()
