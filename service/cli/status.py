"""``raydock status JOB_ID``: one job as a summary a person reads (``--json``: the job
record as the API returns it)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from api.client import Job
from api.errors import RaydockError
from api.schemas import CheckpointPublic, JobPublic, JobStatus
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console
from service.cli.format import duration, num, progress, runtime, status_style, status_text, values

ERROR_LINES = 6  # lines of a failed job's error shown; the rest is in --json and the log
METRICS_SHOWN = 12  # latest metrics listed, at most
RESTARTS_SHOWN = 3  # the newest restarts listed


def status(
    job_id: str,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the job record as JSON (as the API returns it).")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show one job: status and why, progress, runtime, attempts, metrics, checkpoints, errors."""
    with client_for(url, token) as client:
        record = client.request("GET", f"/v1/jobs/{job_id}").json()
        job = JobPublic.model_validate(record)
        if as_json:
            console.print_json(job.model_dump_json())
            return
        handle = Job(client, job)  # the record is read: no second GET of it
        checkpoints = handle.checkpoints()
        search = _search(handle) if job.kind == "tune" else None
    # start_phases is read from the raw record: an SDK older than the server drops it.
    console.print(summary(job, checkpoints, search, record.get("start_phases")))


def _search(job: Job) -> list[tuple[str, str]]:
    """A search's rows: its trials counted by status, and its best trial (so far)."""
    found = job.trials()
    counts = Counter(t.status for t in found)
    rows = [("trials", f"{len(found)}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) if found else "none yet")]
    try:
        best = job.best()
    except RaydockError as exc:
        if exc.code == "no_reports":
            return rows
        raise
    label = "" if best.final else " (so far)"
    rows.append(("best trial", f"{best.trial_id}{label}: {best.metric}={num(best.value)} with {values(best.config)}"))
    return rows


def summary(
    job: JobPublic,
    checkpoints: list[CheckpointPublic],
    search: list[tuple[str, str]] | None = None,
    start_phases: Any = None,
    now: datetime | None = None,
) -> Group:
    """A title line, then a two-column grid: what, then its value (values wrap in their column)."""
    title = Text.assemble((job.name, "bold"), "  ", job.id, "  ", (f"({job.kind})", "dim"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")

    def row(key: str, value: str | Text) -> None:
        # Text, not markup: a reason or an error may hold "[...]", which rich would eat.
        grid.add_row(key, Text(value) if isinstance(value, str) else value)

    state = Text(status_text(job), style=status_style(job.status))
    if job.status_reason:
        state.append(f"  {job.status_reason}")
    row("status", state)
    where = progress(job)
    if where:
        row("progress", where + ("  (newest trial report; budget per trial)" if search else ""))
    row("runtime", _times(job, now))
    row("attempts", _attempts(job))
    for r in job.restarts[-RESTARTS_SHOWN:]:
        at = datetime.fromtimestamp(r.at).strftime("%H:%M:%S")
        row("", Text(f"restart in attempt {r.attempt} at {at}: {r.reason}", style="dim"))
    if job.latest_metrics:
        row("metrics", _metrics(job.latest_metrics))
    for key, value in search or ():
        row(key, value)
    row("checkpoints", _checkpoints(checkpoints))
    if job.labels:
        row("labels", values(job.labels))
    phases = _phases(start_phases)
    if phases:
        row("start-up", phases)
    if job.status == JobStatus.FAILED or job.error:
        row("failure", Text(job.failure_cause.value if job.failure_cause else "FAILED", style="red"))
        for i, line in enumerate(_error_lines(job)):
            row("error" if i == 0 else "", line)
    if job.dropped_events:
        row("dropped", f"{job.dropped_events} event(s) ignored; last: {job.last_dropped_reason or '?'}")
    return Group(title, grid)


def _times(job: JobPublic, now: datetime | None) -> str:
    took = runtime(job, now)
    if took is None:
        waited = ((now or datetime.now(timezone.utc)) - job.created_at).total_seconds()
        return f"not started; submitted {duration(waited)} ago ({job.created_at.astimezone():%Y-%m-%d %H:%M:%S})"
    out = f"{duration(took)}  (started {job.started_at.astimezone():%Y-%m-%d %H:%M:%S}"
    return out + (f", finished {job.finished_at.astimezone():%H:%M:%S})" if job.finished_at else ")")


def _attempts(job: JobPublic) -> str:
    restarts = f"{job.restarts_total} worker-group restart{'s' if job.restarts_total != 1 else ''}"
    return f"{job.attempt} attempt{'s' if job.attempt != 1 else ''}, {restarts}"


def _metrics(latest: dict[str, Any]) -> str:
    items = list(latest.items())
    shown = ", ".join(f"{k}={num(v)}" for k, v in items[:METRICS_SHOWN])
    return shown + (f", ... {len(items) - METRICS_SHOWN} more (--json)" if len(items) > METRICS_SHOWN else "")


def _checkpoints(found: list[CheckpointPublic]) -> str:
    if not found:
        return "none"
    last = found[-1]
    at = ", ".join(f"{k} {v}" for k, v in (("epoch", last.epoch), ("step", last.step)) if v is not None)
    return f"{len(found)}; latest id {last.id}" + (f" at {at}" if at else "") + f" ({last.path})"


def _phases(phases: Any) -> str:
    """Start-up phases as ``name 1.2s``, in the record's order: a mapping of phase to
    seconds, or a list of ``{name, seconds}``; nothing when the record has none."""
    if isinstance(phases, dict):
        pairs = list(phases.items())
    elif isinstance(phases, list):
        pairs = [(p.get("name") or p.get("phase"), p.get("seconds", p.get("s"))) for p in phases if isinstance(p, dict)]
    else:
        return ""
    return ", ".join(f"{k} {v:.1f}s" if isinstance(v, (int, float)) else f"{k} -" for k, v in pairs if k)


def _error_lines(job: JobPublic) -> list[Text]:
    """The error's first lines: the message whole, then the traceback's lines cut at the
    terminal's edge (a folded path is unreadable)."""
    lines = [line for line in (job.error or "").strip().splitlines() if line.strip()]
    out = [Text(lines[0], style="red")] if lines else []
    out += [Text(line, style="red", no_wrap=True, overflow="ellipsis") for line in lines[1:ERROR_LINES]]
    if len(lines) > ERROR_LINES:
        out.append(Text(f"... {len(lines) - ERROR_LINES} more lines: raydock status {job.id} --json", style="dim"))
    return out
