"""Projects and their members: create and list projects, set and remove a member's role.
A server admin manages every project; a project admin their own. A project the caller
does not belong to reads as missing (404 ``project_not_found``), whoever asks.

Error codes: ``project_exists``, ``too_many_projects``, ``last_project_admin`` (409),
``project_not_found``, ``user_not_found`` (404), ``forbidden`` (403: a member or viewer
changing members)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.errors import Conflict, Forbidden, admin_only, project_not_found
from api.schemas.tenancy import MAX_PROJECTS, ProjectPublic, Role
from service.db.models import count, utcnow
from service.db.tenancy_models import MembershipRow, ProjectRow, UserRow
from service.eventlog.log import record
from service.tenancy.caller import Caller
from service.tenancy.caller_cache import Revision
from service.tenancy.users import user_not_found


class Projects:
    def __init__(self, sessions: sessionmaker, revision: Revision | None = None) -> None:
        self.sessions = sessions
        self.revision = revision or Revision()  # bumped after each change (service/tenancy/caller_cache.py)

    def create(self, name: str, caller: Caller) -> ProjectPublic:
        if not caller.admin:
            raise admin_only("Creating a project")
        with self.sessions.begin() as s:
            if count(s, ProjectRow) >= MAX_PROJECTS:
                raise Conflict(f"The server has {MAX_PROJECTS} projects, its cap.", code="too_many_projects")
            if s.get(ProjectRow, name) is not None:
                raise _exists(name)
            s.add(ProjectRow(name=name, created_at=utcnow()))
            try:
                s.flush()
            except IntegrityError:
                raise _exists(name) from None
            record(s, "project_created", actor=caller.name, project=name)
        return self.get(name, caller)

    def exists(self, name: str) -> bool:
        with self.sessions() as s:
            return s.get(ProjectRow, name) is not None

    def get(self, name: str, caller: Caller) -> ProjectPublic:
        if not caller.can_read(name):
            raise project_not_found(name)
        with self.sessions() as s:
            row = s.get(ProjectRow, name)
            if row is None:
                raise project_not_found(name)
            return _public(s, row)

    def list(self, caller: Caller) -> list[ProjectPublic]:
        with self.sessions() as s:
            q = select(ProjectRow).order_by(ProjectRow.name)
            if (mine := caller.projects) is not None:
                q = q.where(ProjectRow.name.in_(mine))
            return [_public(s, row) for row in s.scalars(q)]

    def set_member(self, name: str, user: str, role: Role, caller: Caller) -> ProjectPublic:
        self._may_manage(name, caller)
        with self.sessions.begin() as s:
            self._project(s, name)
            user_id = _user_id(s, user)
            row = s.get(MembershipRow, (name, user_id))
            if row is None:
                s.add(MembershipRow(project=name, user_id=user_id, role=role, created_at=utcnow()))
            else:
                if row.role == "admin" and role != "admin":
                    _keep_an_admin(s, name)
                row.role = role
            record(s, "member_set", actor=caller.name, project=name, user=user, role=role)
        self.revision.bump()
        return self.get(name, caller)

    def remove_member(self, name: str, user: str, caller: Caller) -> None:
        self._may_manage(name, caller)
        with self.sessions.begin() as s:
            self._project(s, name)
            user_id = _user_id(s, user)
            row = s.get(MembershipRow, (name, user_id))
            if row is None:
                raise user_not_found(user)
            if row.role == "admin":
                _keep_an_admin(s, name)
            s.execute(delete(MembershipRow).where(MembershipRow.project == name, MembershipRow.user_id == user_id))
            record(s, "member_removed", actor=caller.name, project=name, user=user)
        self.revision.bump()

    @staticmethod
    def _may_manage(name: str, caller: Caller) -> None:
        if caller.can_manage(name):
            return
        if caller.can_read(name):  # a member or viewer: the project's existence is no secret to them
            raise Forbidden(
                f"You are {caller.roles[name]} in project {name!r}; its admins manage members.", code="forbidden_role"
            )
        raise project_not_found(name)

    @staticmethod
    def _project(s: Session, name: str) -> ProjectRow:
        row = s.get(ProjectRow, name)
        if row is None:
            raise project_not_found(name)
        return row


def _user_id(s: Session, name: str) -> int:
    user_id = s.scalar(select(UserRow.id).where(UserRow.name == name))
    if user_id is None:
        raise user_not_found(name)
    return user_id


def _keep_an_admin(s: Session, project: str) -> None:
    """A server admin can always manage a project, so a project may be left without an
    admin of its own only by one; the check keeps a project admin from locking all out."""
    admins = count(s, MembershipRow, MembershipRow.project == project, MembershipRow.role == "admin")
    if admins <= 1:
        raise Conflict(
            f"This is project {project!r}'s last admin; make another member admin first.", code="last_project_admin"
        )


def _exists(name: str) -> Conflict:
    return Conflict(f"Project {name!r} exists already.", code="project_exists")


def _public(s: Session, row: ProjectRow) -> ProjectPublic:
    members = s.execute(
        select(UserRow.name, MembershipRow.role)
        .join(UserRow, UserRow.id == MembershipRow.user_id)
        .where(MembershipRow.project == row.name)
        .order_by(UserRow.name)
    )
    return ProjectPublic(name=row.name, created_at=row.created_at, members={m.name: m.role for m in members})
