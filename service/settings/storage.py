"""Where the server keeps what it stores, and for how long: the ``storage`` and
``retention`` sections of ``service.settings.Settings``."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field

from api import object_store
from service.settings.section import Section


class StorageSettings(Section):
    data_dir: Path = Field(
        default=Path.home() / ".raydock", description="Where SQLite, the local cluster and checkpoints live."
    )
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in data_dir when unset.")
    storage_path: str | None = Field(
        default=None, description="Checkpoint storage: a directory or a pyarrow URI (s3://...)."
    )
    # Read where pyarrow and boto read them; the server's own pyarrow reads them too. Handed
    # to each job's driver (and so its workers) when storage is an object store: the
    # endpoint and region only, never a credential (every node has its own).
    storage_endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^@\s/]+(/[^@\s]*)?$",
        validation_alias=AliasChoices("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        description="The S3 endpoint (http(s)://host:port, no credentials in it), as AWS's SDKs read it.",
    )
    storage_region: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9-]+$",
        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="The S3 region, as AWS's SDKs read it.",
    )

    def prepare_data_dir(self) -> None:
        """Create the data dir readable by the server's user only (it holds every job's
        record and the cluster token), and the SQLite file 0600 before SQLite makes it
        (its -wal/-shm files copy the database file's mode)."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _chmod(self.data_dir, 0o700)
        db = self.sqlite_path
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
            for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                _chmod(path, 0o600)

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite database file, or None for another database (or an in-memory one)."""
        from sqlalchemy.engine import make_url

        url = make_url(self.resolved_database_url)
        if (
            url.get_backend_name() != "sqlite"
            or not url.database
            or url.database == ":memory:"
            or url.database.startswith("file:")
        ):
            return None
        return Path(url.database)

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'raydock.db'}"

    @cached_property
    def resolved_storage_path(self) -> str:
        return self.storage_path or str((self.data_dir / "storage").resolve())

    @property
    def object_store_env(self) -> dict[str, str]:
        """What a job's driver needs to reach an object store the way the server does:
        the endpoint and region it was given (nothing for local storage, nothing secret)."""
        if object_store.is_local(self.resolved_storage_path):
            return {}
        env = {"AWS_ENDPOINT_URL_S3": self.storage_endpoint} if self.storage_endpoint else {}
        return env | ({"AWS_REGION": self.storage_region} if self.storage_region else {})


class RetentionSettings(Section):
    retention_days: float | None = Field(
        default=None, gt=0, description="Delete finished jobs (rows and storage) this many days after they finished."
    )
    retention_max_finished: int | None = Field(
        default=None,
        ge=0,
        description="Keep at most this many finished jobs, the most recently finished; delete the rest.",
    )
    retention_interval_s: float = Field(
        default=60.0, gt=0, description="How often the background retention sweep runs."
    )
    event_log_retention_days: float = Field(
        default=90.0,
        gt=0,
        le=36_600,
        description="Event-log rows (and webhook deliveries) older than this many days are deleted by the retention sweep.",
    )


def _chmod(path: Path, mode: int) -> None:
    """Tighten a path the server owns; a path owned by someone else is left as it is."""
    try:
        if path.exists() and path.stat().st_uid == os.geteuid():
            path.chmod(mode)
    except OSError:
        pass
