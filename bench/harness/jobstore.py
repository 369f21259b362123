"""The server's parts on a real database with no Ray behind it (a port where no dashboard
answers), built by the composition root (``service.runtime.compose``): submits are
recorded and stay QUEUED. For the store, queue and retention tests, on SQLite and on the
session's PostgreSQL (``database_url``)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from api.schemas import parse_job_spec
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import JobRow
from service.runtime import Runtime, compose
from service.settings import Settings


def dead_ray() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there


def job_service(database_url: str, data_dir: Path) -> Runtime:
    """Every part of a server over this store, none of its background units started."""
    address = dead_ray()
    settings = Settings(storage={"data_dir": data_dir, "database_url": database_url}, cluster={"ray_address": address})
    return compose(settings, make_sessionmaker(make_engine(database_url)), RayBackend(address, timeout_s=2))


def submit(service: Runtime, **overrides) -> str:
    job, created = service.jobs.submit(parse_job_spec(digits_spec(**overrides)))
    assert created
    return job.id


def set_columns(service: Runtime, job_ids: list[str] | str, **values) -> None:
    """Put jobs where a test needs them (a status, a time) directly in the store."""
    ids = [job_ids] if isinstance(job_ids, str) else job_ids
    with service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id.in_(ids)).values(**values))
