"""``raydock schedule create|list|pause|resume|delete``: jobs that submit themselves on a
cron. ``create`` takes a job spec file (YAML or JSON, as ``raydock submit`` does) and
the cron options, or a schedule file (one with ``cron:`` and ``job:``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from pydantic import ValidationError
from rich import box
from rich.table import Table

from api.schemas.schedules import SchedulePublic, ScheduleSpec
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, app, client_for, console, fail

schedule_app = typer.Typer(help="Schedules: jobs submitted on a cron.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("create")
def create(
    spec_file: Annotated[Path, typer.Argument(help="A job spec, or a whole schedule (with cron: and job:).")],
    cron: Annotated[Optional[str], typer.Option(help="Five cron fields or @daily etc. (with a job spec).")] = None,
    name: Annotated[Optional[str], typer.Option(help="The schedule's name (default: the job's).")] = None,
    timezone: Annotated[str, typer.Option(help="IANA time zone of the cron fields.")] = "UTC",
    concurrency: Annotated[str, typer.Option(help="forbid | allow | replace")] = "forbid",
    catch_up: Annotated[str, typer.Option(help="skip | once: ticks missed while the server was down.")] = "skip",
    paused: Annotated[bool, typer.Option(help="Create it paused.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Create a schedule; prints its id and next firing times."""
    try:
        raw = yaml.safe_load(spec_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {spec_file}: {exc}")
    if not isinstance(raw, dict):
        fail(f"{spec_file} must hold a mapping (a job spec or a schedule)")
    if "cron" not in raw or "job" not in raw:
        if cron is None:
            fail(f"{spec_file} is a job spec: give --cron (e.g. --cron '0 3 * * *')", code=2)
        options = {"timezone": timezone, "concurrency": concurrency, "catch_up": catch_up, "paused": paused}
        raw = {"name": name or raw.get("name", "schedule"), "cron": cron, **options, "job": raw}
    try:
        spec = ScheduleSpec.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        fail(f"{spec_file} is not a valid schedule:\n" + "\n".join(lines), code=2)
    with client_for(url, token) as client:
        made = client.create_schedule(spec, base_dir=spec_file.parent)
    console.print(made.id)
    console.print("next: " + ", ".join(t.isoformat() for t in made.next_runs), style="dim")


@schedule_app.command("list")
def list_schedules(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """The schedules of your projects, with each one's next firing and what its last tick did."""
    with client_for(url, token) as client:
        items = client.schedules()
    if as_json:
        console.print_json(data=[s.model_dump(mode="json") for s in items])
        return
    if not items:
        console.print("no schedules yet: create one with `raydock schedule create SPEC --cron '0 3 * * *'`")
        return
    console.print(table(items))


def table(items: list[SchedulePublic]) -> Table:
    t = Table(box=box.SIMPLE_HEAD)
    for header in ("ID", "NAME", "PROJECT", "CRON", "NEXT", "FIRED", "LAST"):
        t.add_column(header, overflow="ellipsis", no_wrap=True)
    for s in items:
        upcoming = "paused" if s.paused else (s.next_runs[0].strftime("%Y-%m-%d %H:%M UTC") if s.next_runs else "-")
        cron = s.cron if s.timezone == "UTC" else f"{s.cron} ({s.timezone})"
        t.add_row(s.id, s.name, s.project, cron, upcoming, str(s.fired), s.last_outcome or "-")
    return t


def _act(action: str, schedule_id: str, url: str, token: str | None) -> None:
    with client_for(url, token) as client:
        if action == "delete":
            client.delete_schedule(schedule_id)
            console.print(f"{schedule_id} deleted (the jobs it submitted stay)")
            return
        done = client.pause_schedule(schedule_id) if action == "pause" else client.resume_schedule(schedule_id)
    console.print(f"{done.id} {'paused' if done.paused else 'resumed: next ' + done.next_runs[0].isoformat()}")


@schedule_app.command("pause")
def pause(schedule_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Fire nothing until resumed."""
    _act("pause", schedule_id, url, token)


@schedule_app.command("resume")
def resume(schedule_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Fire again from the next tick (ticks that passed while paused are not run)."""
    _act("resume", schedule_id, url, token)


@schedule_app.command("delete")
def delete(schedule_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Delete a schedule; the jobs it submitted stay."""
    _act("delete", schedule_id, url, token)
