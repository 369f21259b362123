"""``raydock gc``: history retention by hand (``service/retention.py``), on the store the
server's own ``RAYDOCK_*`` settings name. It works on the database directly, so it runs
where the server runs; it is safe while the server runs (the same batches and checks)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from service.cli.common import need_server


def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be deleted.")] = False,
    days: Annotated[
        Optional[float],
        typer.Option(min=0, help="Finished more than this many days ago (default RAYDOCK_RETENTION_DAYS)."),
    ] = None,
    max_finished: Annotated[
        Optional[int],
        typer.Option(min=0, help="Keep this many finished jobs, the newest (default RAYDOCK_RETENTION_MAX_FINISHED)."),
    ] = None,
    show: Annotated[int, typer.Option(min=0, help="How many of the jobs to list.")] = 20,
) -> None:
    """Delete finished jobs past the retention policy, with their rows and storage."""
    # Imported here: every other command of the CLI is a client and needs no database.
    need_server("gc")
    from service.db.engine import make_engine, make_sessionmaker
    from service.retention import Policy, Retention
    from service.settings import Settings

    console = Console()
    settings = Settings()
    configured = Policy.from_settings(settings)
    policy = Policy(
        days if days is not None else configured.days,
        max_finished if max_finished is not None else configured.max_finished,
    )
    if not policy.is_set:
        Console(stderr=True).print(
            "[red]error:[/red] no retention policy: set RAYDOCK_RETENTION_DAYS / RAYDOCK_RETENTION_MAX_FINISHED, or pass --days / --max-finished"
        )
        raise typer.Exit(1)
    sessions = make_sessionmaker(make_engine(settings.storage.resolved_database_url))
    retention = Retention(sessions, settings.storage.resolved_storage_path, policy, ray=_cluster(settings))
    doomed, total = retention.due(limit=show)
    table = Table("ID", "NAME", "STATUS", "FINISHED")
    for d in doomed:
        table.add_row(d.id, d.name, d.status, d.finished_at.strftime("%Y-%m-%d %H:%M:%S"))
    console.print(table)
    if dry_run:
        console.print(f"would delete {total} finished job(s) ({policy}); {len(doomed)} listed")
        return
    console.print(f"deleted {retention.sweep()} finished job(s) ({policy})")
    records = retention.ray_records
    if records.unreachable:
        console.print("the cluster did not answer: Ray's records of their Ray jobs stay until a sweep reaches it")
    elif records.deleted or records.left:
        console.print(f"deleted Ray's records of {records.deleted} Ray job(s); {records.left} left for the next sweep")


def _cluster(settings):
    """The server's cluster (RAY_ADDRESS, or the local head it started), if there is one:
    Ray's records of the deleted jobs go with them (a head that is gone took them along)."""
    from service.cluster.local_cluster import find_head
    from service.cluster.ray_backend import RayBackend

    head = None if settings.cluster.ray_address else find_head(settings.storage.data_dir / "ray")
    address = settings.cluster.ray_address or (head.dashboard_url if head else None)
    return RayBackend(address, auth_token=head.auth_token() if head else None, timeout_s=5) if address else None
