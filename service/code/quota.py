"""Each project's quota of stored code: the bytes of the packages it holds (a package
two projects hold counts for both, since either may keep it alive), at most
``RAYDOCK_CODE_QUOTA_BYTES``. An upload that would take its project past it is refused
(413 ``code_quota_exceeded``) before it is read when its length is declared, and again
before it is stored."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.errors import RaydockError
from service.db.models import CodePackageRow
from service.db.tenancy_models import CodeRefRow


def held(s: Session, project: str) -> tuple[int, int]:
    """(packages, bytes) the project holds."""
    n, size = s.execute(
        select(func.count(), func.coalesce(func.sum(CodePackageRow.size_bytes), 0))
        .select_from(CodeRefRow)
        .join(CodePackageRow, CodePackageRow.sha256 == CodeRefRow.sha256)
        .where(CodeRefRow.project == project)
    ).one()
    return int(n), int(size)


def check(s: Session, project: str, size: int, quota: int, retention_s: float) -> None:
    """Refuse a package of ``size`` bytes that would take ``project`` past ``quota``."""
    n, used = held(s, project)
    if used + size <= quota:
        return
    raise RaydockError(
        f"Project {project!r} holds {n} code packages of {used} bytes; this one of {size} bytes would take it past "
        f"its quota of {quota} bytes of code (RAYDOCK_CODE_QUOTA_BYTES). Free space: delete the project's jobs that "
        "run packages you no longer need (DELETE /v1/jobs/{id}); a package no job of the project runs is let go "
        f"{retention_s:g} s after the project last uploaded or submitted it (RAYDOCK_CODE_RETENTION_S). "
        "Or ask the operator to raise the quota.",
        code="code_quota_exceeded",
        status=413,
        details=[{"quota": "code_quota_bytes", "project": project, "used": used, "size": size, "limit": quota}],
    )
