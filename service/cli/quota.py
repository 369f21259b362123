"""``raydock quota set|show PROJECT``: a project's quota and what it uses."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from api.schemas import QuotaSpec
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, app, client_for, console, fail

quota_app = typer.Typer(help="Project quotas: set and show.", no_args_is_help=True)
app.add_typer(quota_app, name="quota")


@quota_app.command("set")
def set_quota(
    project: str,
    guaranteed_cpus: Annotated[Optional[float], typer.Option(help="CPUs the project can always get.")] = None,
    guaranteed_gpus: Annotated[Optional[float], typer.Option(help="GPUs the project can always get.")] = None,
    max_cpus: Annotated[Optional[float], typer.Option(help="Most CPUs, borrowing included.")] = None,
    max_gpus: Annotated[Optional[float], typer.Option(help="Most GPUs, borrowing included.")] = None,
    max_running: Annotated[Optional[int], typer.Option(help="Most jobs running at once.")] = None,
    max_queued: Annotated[Optional[int], typer.Option(help="Most jobs waiting; more submits get 429.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Set PROJECT's whole quota (an option left out: no limit, or a guarantee of 0)."""
    try:
        spec = QuotaSpec(
            guaranteed_cpus=guaranteed_cpus,
            guaranteed_gpus=guaranteed_gpus,
            max_cpus=max_cpus,
            max_gpus=max_gpus,
            max_running=max_running,
            max_queued=max_queued,
        )
    except ValidationError as exc:
        fail(str(exc))
    with client_for(url, token) as client:
        _print(client.set_quota(project, spec))


@quota_app.command("show")
def show_quota(project: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Show PROJECT's quota, what it holds now and its decayed recent usage."""
    with client_for(url, token) as client:
        _print(client.quota(project))


def _limit(v) -> str:
    return "-" if v is None else f"{v:g}"


def _print(q) -> None:
    console.print(f"project {q.project} (quota: {q.source})")
    console.print(
        f"  CPUs  guaranteed {_limit(q.guaranteed_cpus or 0)}  max {_limit(q.max_cpus)}  in use {q.cpus_in_use:g}"
    )
    console.print(
        f"  GPUs  guaranteed {_limit(q.guaranteed_gpus or 0)}  max {_limit(q.max_gpus)}  in use {q.gpus_in_use:g}"
    )
    console.print(
        f"  jobs  running {q.running} of {_limit(q.max_running)}  queued {q.queued} of {_limit(q.max_queued)}"
    )
    console.print(f"  recent usage  {q.decayed_cpu_seconds:.0f} CPU-s  {q.decayed_gpu_seconds:.0f} GPU-s (decayed)")
