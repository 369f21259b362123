"""``raydock events JOB_ID``: what happened to a job, who did it, and when."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from api.client import Client
from api.schemas.eventlog import EventPublic
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, app, client_for, console


@app.command()
def events(
    job_id: str,
    type: Annotated[
        Optional[str], typer.Option("--type", help="Only events of this type (e.g. status_changed).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show a job's event log: submitted, each status change with its reason, checkpoints,
    cancels and resumes with who made them."""
    with client_for(url, token) as client:
        found = _events(client, job_id, type)  # a deleted job's events too: they outlive it
    if as_json:
        for e in found:
            console.print_json(e.model_dump_json())
        return
    table = Table("ID", "AT", "TYPE", "ACTOR", "DETAILS")
    for e in found:
        table.add_row(str(e.id), e.at.isoformat(timespec="seconds"), e.type, e.actor, _details(e.type, e.data))
    console.print(table)


def _events(client: Client, job_id: str, type: str | None) -> list[EventPublic]:
    out, since = [], 0
    while True:
        page = client.events(job=job_id, type=type, since=since, limit=1000)
        out += page.items
        if page.next is None:
            return out
        since = page.next


def _details(type: str, data: dict) -> str:
    if type == "status_changed":
        cause = f" [{data['cause']}]" if data.get("cause") else ""
        return f"{data.get('from')} -> {data.get('to')}{cause}: {data.get('reason') or ''}"
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in data.items())
