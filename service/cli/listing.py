"""``raydock list``: the jobs, newest first, as a table that fits the terminal (80
columns and up: wider terminals get more columns, nothing wraps); ``--json`` the page."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from api.schemas import JobPublic, JobStatus
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console, fail
from service.cli.format import cut, duration, num, progress, runtime, status_style, status_text, values, when, widest

WIDE = 120  # from this width on, the table adds the status reason, labels and metrics
METRICS = ("train_loss", "loss", "val_loss", "val_acc")  # the ones a wide list shows, if reported


def list_jobs(
    status: Annotated[Optional[JobStatus], typer.Option(help="Only jobs in this status.")] = None,
    label: Annotated[Optional[list[str]], typer.Option(help="key=value filter; repeatable.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most jobs to show (pages are followed).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List jobs, newest first."""
    bad = [item for item in label or [] if "=" not in item]
    if bad:
        fail(f"--label takes key=value, not {bad[0]!r}", code=2)
    labels = dict(item.split("=", 1) for item in label or [])
    with client_for(url, token) as client:
        page = client.list(status=status, labels=labels, limit=min(limit, 1000))
        items = list(page.items)
        while page.next is not None and len(items) < limit:
            page = client.list(status=status, labels=labels, limit=min(limit - len(items), 1000), cursor=page.next)
            items += page.items
    if as_json:
        console.print_json(page.model_copy(update={"items": items, "limit": limit}).model_dump_json())
        return
    if not items:
        console.print("no jobs" + (" match" if status or labels else " yet: submit one with `raydock submit SPEC`"))
        return
    console.print(jobs_table(items, console.width))
    shown = f"{len(items)} of {page.total} jobs" if page.total > len(items) else f"{len(items)} jobs"
    console.print(shown + ("; more with --limit" if page.total > len(items) else ""), style="dim")


def jobs_table(jobs: list[JobPublic], width: int, now: datetime | None = None) -> Table:
    """The jobs as a table for a terminal ``width`` wide: ids never cut (commands take
    them), names and reasons cut with an ellipsis, never wrapped onto a second line."""
    now = now or datetime.now(timezone.utc)
    wide = width >= WIDE
    # The columns that never give way, with their cells: id, status, progress, runtime, created.
    fixed = {
        "ID": [j.id for j in jobs],
        "STATUS": [status_text(j) for j in jobs],
        "PROGRESS": [progress(j) for j in jobs],
        "RUNTIME": [duration(runtime(j, now)) for j in jobs],
        "CREATED": [when(j.created_at, now) for j in jobs],
    }

    def column(header: str, **kw) -> None:
        table.add_column(header, no_wrap=True, min_width=widest(header, fixed[header]), **kw)

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    column("ID")
    table.add_column("NAME", min_width=6, max_width=32 if wide else 20)
    column("STATUS")
    if wide:
        table.add_column("REASON", max_width=40)
    column("PROGRESS")
    column("RUNTIME", justify="right")
    column("CREATED")
    if wide:
        table.add_column("LABELS", max_width=24)
        table.add_column("METRICS")
    for i, j in enumerate(jobs):
        cells = [Text(fixed["ID"][i]), cut(j.name), Text(fixed["STATUS"][i], style=status_style(j.status))]
        if wide:
            cells.append(cut(j.status_reason or "", style="dim"))
        cells += [Text(fixed[h][i]) for h in ("PROGRESS", "RUNTIME", "CREATED")]
        if wide:
            m = j.latest_metrics or {}
            cells += [cut(values(j.labels)), cut(", ".join(f"{k}={num(m[k])}" for k in METRICS if k in m))]
        table.add_row(*cells)
    return table
