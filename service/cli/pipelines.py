"""``raydock pipeline submit|status|list|cancel|resume``: a graph of jobs submitted as one.
``submit`` takes a pipeline file (YAML or JSON: ``name:`` and ``steps:``, each step a
``name``, a ``job`` spec and its ``after`` / ``init_from`` by step name)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError
from rich import box
from rich.table import Table

from api.schemas.pipelines import PipelinePublic, PipelineSpec
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, app, client_for, console, fail

pipeline_app = typer.Typer(help="Pipelines: jobs that run after each other, submitted as one.", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


@pipeline_app.command("submit")
def submit(
    spec_file: Annotated[Path, typer.Argument(help="A pipeline (name: and steps:), YAML or JSON.")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Submit a pipeline; prints its id and each step's job."""
    try:
        raw = yaml.safe_load(spec_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {spec_file}: {exc}")
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:10]]
        fail(f"{spec_file} is not a valid pipeline:\n" + "\n".join(lines), code=2)
    with client_for(url, token) as client:
        made = client.submit_pipeline(spec, base_dir=spec_file.parent)
    console.print(made.id)
    console.print(steps_table(made))


@pipeline_app.command("status")
def status(
    pipeline_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """The pipeline's status and each step's, with what it runs after."""
    with client_for(url, token) as client:
        p = client.pipeline(pipeline_id)
    if as_json:
        console.print_json(data=p.model_dump(mode="json"))
        return
    console.print(f"{p.id} {p.name} ({p.project}): {p.status.value}")
    console.print(steps_table(p))


@pipeline_app.command("list")
def list_pipelines(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """The pipelines of your projects, newest first."""
    with client_for(url, token) as client:
        items = client.pipelines()
    if not items:
        console.print("no pipelines yet: submit one with `raydock pipeline submit FILE`")
        return
    t = Table(box=box.SIMPLE_HEAD)
    for header in ("ID", "NAME", "PROJECT", "STATUS", "STEPS"):
        t.add_column(header, overflow="ellipsis", no_wrap=True)
    for p in items:
        done = sum(1 for s in p.steps if s.status.is_terminal())
        t.add_row(p.id, p.name, p.project, p.status.value, f"{done}/{len(p.steps)} ended")
    console.print(t)


def steps_table(p: PipelinePublic) -> Table:
    t = Table(box=box.SIMPLE_HEAD)
    for header in ("STEP", "JOB", "STATUS", "AFTER", "REASON"):
        t.add_column(header, overflow="fold")
    for s in p.steps:
        after = ", ".join(f"{a.get('step') or a.get('job')} ({a.get('status', 'SUCCEEDED')})" for a in s.after)
        if s.init_from:
            after += f"{', ' if after else ''}init_from {s.init_from.get('step') or s.init_from.get('job')}"
        t.add_row(s.name, s.job_id, s.status.value, after or "-", s.status_reason or "")
    return t


def _act(action: str, pipeline_id: str, url: str, token: str | None) -> None:
    with client_for(url, token) as client:
        done = client.cancel_pipeline(pipeline_id) if action == "cancel" else client.resume_pipeline(pipeline_id)
    console.print(f"{done.id}: {done.status.value}")
    console.print(steps_table(done))


@pipeline_app.command("cancel")
def cancel(pipeline_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel every step that has not ended."""
    _act("cancel", pipeline_id, url, token)


@pipeline_app.command("resume")
def resume(pipeline_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Run the FAILED and CANCELLED steps again; SUCCEEDED ones are kept."""
    _act("resume", pipeline_id, url, token)
