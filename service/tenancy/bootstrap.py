"""The first start: the project ``default`` and a server admin named ``admin`` with one
token, written to ``<data dir>/admin-token`` (0600, in the 0700 data dir). The log says
where the file is, never the token."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.schemas.tenancy import DEFAULT_PROJECT
from service.db.models import utcnow
from service.db.tenancy_models import ProjectRow, UserRow
from service.eventlog.log import SYSTEM, record
from service.tenancy.caller import ADMIN_NAME
from service.tenancy.users import Users

log = logging.getLogger("raydock.tenancy")
TOKEN_FILE = "admin-token"


def bootstrap(sessions: sessionmaker, data_dir: Path) -> Path | None:
    """Make what a first start needs; returns the token file when one was written."""
    with sessions.begin() as s:
        if s.get(ProjectRow, DEFAULT_PROJECT) is None:
            s.add(ProjectRow(name=DEFAULT_PROJECT, created_at=utcnow()))
        if s.scalar(select(UserRow.id).where(UserRow.is_admin.is_(True)).limit(1)) is not None:
            return None
        admin = s.scalar(select(UserRow).where(UserRow.name == ADMIN_NAME))
        if admin is None:
            admin = UserRow(name=ADMIN_NAME, is_admin=True, created_at=utcnow())
            s.add(admin)
            s.flush()
            record(s, "user_created", actor=SYSTEM, user=ADMIN_NAME, admin=True)
        admin.is_admin = True
        token = Users(sessions).add_token_for(s, admin.id, "bootstrap")
        path = data_dir / TOKEN_FILE
        _write_private(path, token + "\n")
    log.warning("created the server admin %r; its API token is in %s (readable by this user only)", ADMIN_NAME, path)
    return path


def _write_private(path: Path, text: str) -> None:
    """Created 0600 from the start: the token is never readable by anyone else, not even briefly."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
