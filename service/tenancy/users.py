"""Users and their API tokens: create, list and delete users; create (shown once), list
and revoke tokens. Every change is written to the event log with the acting user.

Error codes: ``user_exists``, ``last_admin``, ``too_many_tokens``, ``too_many_users`` (409),
``user_not_found``, ``token_not_found`` (404), ``user_name_reserved``,
``token_lifetime_too_long`` (422)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.errors import Conflict, InvalidSpec, NotFound, project_not_found
from api.schemas.tenancy import (
    DEFAULT_TOKEN_TTL_DAYS,
    MAX_TOKENS_PER_USER,
    MAX_USERS,
    RESERVED_USER_NAMES,
    Membership,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserCreate,
    UserPublic,
)
from service.db.models import aware, count, utcnow
from service.db.tenancy_models import ApiTokenRow, MembershipRow, ProjectRow, UserRow
from service.eventlog.log import record
from service.tenancy import local_mode
from service.tenancy.caller import ADMIN_NAME, roles_of
from service.tenancy.caller_cache import Revision
from service.tenancy.tokens import new_token


def user_not_found(name: str) -> NotFound:
    return NotFound(f"No user {name!r}. List users with GET /v1/users.", code="user_not_found")


class Users:
    """``max_token_ttl_days``: the longest a token made here lives (RAYDOCK_MAX_TOKEN_TTL_DAYS).
    ``revision``: bumped after each change, so remembered callers are read again
    (``service/tenancy/caller_cache.py``)."""

    def __init__(
        self,
        sessions: sessionmaker,
        max_token_ttl_days: float = DEFAULT_TOKEN_TTL_DAYS,
        revision: Revision | None = None,
    ) -> None:
        self.sessions = sessions
        self.revision = revision or Revision()
        self.max_token_ttl_days = max_token_ttl_days
        self.local_mode = local_mode.LocalMode(sessions)

    # ------------------------------------------------------------------ users

    def create(self, body: UserCreate, *, actor: str) -> UserPublic:
        if body.name in RESERVED_USER_NAMES:
            raise _reserved(body.name)
        with self.sessions.begin() as s:
            if count(s, UserRow) >= MAX_USERS:
                raise Conflict(f"The server has {MAX_USERS} users, its cap; delete one first.", code="too_many_users")
            if s.scalar(select(UserRow.id).where(UserRow.name == body.name)) is not None:
                raise _exists(body.name)
            if body.project is not None and s.get(ProjectRow, body.project) is None:
                raise project_not_found(body.project)
            user = UserRow(name=body.name, is_admin=body.admin, created_at=utcnow())
            s.add(user)
            try:
                s.flush()
            except IntegrityError:
                raise _exists(body.name) from None
            if body.project is not None:
                s.add(MembershipRow(project=body.project, user_id=user.id, role=body.role, created_at=utcnow()))
            record(s, "user_created", actor=actor, user=body.name, admin=body.admin, project=body.project)
        self.revision.bump()
        return self.get(body.name)

    def get(self, name: str) -> UserPublic:
        with self.sessions() as s:
            user = self._user(s, name)
            return _public(user, roles_of(s, user.id))

    def list(self) -> list[UserPublic]:
        with self.sessions() as s:
            users = s.scalars(select(UserRow).order_by(UserRow.name)).all()
            return [_public(u, roles_of(s, u.id)) for u in users]

    def delete(self, name: str, *, actor: str) -> None:
        with self.sessions.begin() as s:
            user = self._user(s, name)
            if user.is_admin and count(s, UserRow, UserRow.is_admin.is_(True)) <= 1:
                raise Conflict(
                    f"{name!r} is the last server admin; make another user an admin first.", code="last_admin"
                )
            s.delete(user)  # its tokens and memberships go with it (ON DELETE CASCADE)
            s.flush()
            for table in (ApiTokenRow, MembershipRow):  # SQLite without the pragma, or an old row
                s.query(table).filter(table.user_id == user.id).delete()
            record(s, "user_deleted", actor=actor, user=name)
        self.revision.bump()

    @staticmethod
    def _user(s: Session, name: str) -> UserRow:
        user = s.scalar(select(UserRow).where(UserRow.name == name))
        if user is None:
            raise user_not_found(name)
        return user

    # ------------------------------------------------------------------ tokens

    def create_token(
        self, name: str, body: TokenCreate, *, actor: str, not_after: datetime | None = None
    ) -> TokenCreated:
        """A new token for ``name``, living as long as asked, at most the server's longest
        token lifetime and never past ``not_after`` (when the token that asks expires)."""
        token, digest = new_token()
        now = utcnow()
        expires = self._expiry(now, body.expires_in_days, not_after)
        with self.sessions.begin() as s:
            user = self._user(s, name)
            live = count(s, ApiTokenRow, ApiTokenRow.user_id == user.id, *_live(now))
            if live >= MAX_TOKENS_PER_USER:
                raise Conflict(
                    f"User {name!r} has {live} live tokens, the cap; revoke one first "
                    f"(raydock token revoke --user {name} ID).",
                    code="too_many_tokens",
                )
            row = ApiTokenRow(user_id=user.id, token_hash=digest, name=body.name, created_at=now, expires_at=expires)
            s.add(row)
            s.flush()
            record(s, "token_created", actor=actor, user=name, token_id=row.id, name=body.name)
            if name != ADMIN_NAME:  # someone else can sign in now: local mode is over, for good
                local_mode.end(s)
            public = _token(row, name)
        self.local_mode.forget()
        return TokenCreated(**public.model_dump(), token=token)

    def _expiry(self, now: datetime, days: float | None, not_after: datetime | None) -> datetime:
        """When a token asked to live ``days`` (None: as long as allowed) expires; 422
        ``token_lifetime_too_long`` past the server's cap or the asking token's own expiry."""
        latest = now + timedelta(days=self.max_token_ttl_days)
        bound = f"the server's longest token lifetime, {self.max_token_ttl_days:g} days (RAYDOCK_MAX_TOKEN_TTL_DAYS)"
        if not_after is not None and aware(not_after) < latest:
            latest = aware(not_after)
            bound = f"the token this request was sent with, which expires at {latest.isoformat(timespec='seconds')}"
        if days is None:
            return latest
        expires = now + timedelta(days=days)
        if expires > latest:
            room = max((latest - now).total_seconds() / 86_400, 0.0)
            raise InvalidSpec(
                f"A token may not outlive {bound}. Ask for at most {room:.4g} days (expires_in_days), "
                "or leave it out for the longest allowed.",
                code="token_lifetime_too_long",
                details=[{"loc": ["body", "expires_in_days"], "msg": f"at most {room:.4g} days"}],
            )
        return expires

    def tokens(self, name: str) -> list[TokenPublic]:
        with self.sessions() as s:
            user = self._user(s, name)
            rows = s.scalars(select(ApiTokenRow).where(ApiTokenRow.user_id == user.id).order_by(ApiTokenRow.id))
            return [_token(r, name) for r in rows]

    def revoke_token(self, name: str, token_id: int, *, actor: str) -> None:
        with self.sessions.begin() as s:
            user = self._user(s, name)
            row = s.get(ApiTokenRow, token_id)
            if row is None or row.user_id != user.id:
                raise NotFound(
                    f"User {name!r} has no token {token_id}. List them with GET /v1/users/{name}/tokens.",
                    code="token_not_found",
                )
            if row.revoked_at is None:
                row.revoked_at = utcnow()
                record(s, "token_revoked", actor=actor, user=name, token_id=token_id)
        self.revision.bump()

    def add_token_for(self, s: Session, user_id: int, label: str) -> str:
        """A token made in the caller's transaction (the first start's admin)."""
        token, digest = new_token()
        s.add(ApiTokenRow(user_id=user_id, token_hash=digest, name=label, created_at=utcnow()))
        return token


def _live(now) -> tuple:
    return ApiTokenRow.revoked_at.is_(None), or_(ApiTokenRow.expires_at.is_(None), ApiTokenRow.expires_at > now)


def _reserved(name: str) -> InvalidSpec:
    return InvalidSpec(
        f"The user name {name!r} is reserved: 'admin' is the server admin that RAYDOCK_API_TOKEN and local mode "
        "act as, 'system' the server itself in the event log. Pick another name.",
        code="user_name_reserved",
        details=[{"loc": ["body", "name"], "msg": "reserved: " + ", ".join(sorted(RESERVED_USER_NAMES))}],
    )


def _exists(name: str) -> Conflict:
    return Conflict(f"User {name!r} exists already. Pick another name.", code="user_exists")


def _public(user: UserRow, roles: dict[str, str]) -> UserPublic:
    return UserPublic(
        name=user.name,
        admin=bool(user.is_admin),
        created_at=user.created_at,
        projects=[Membership(project=p, role=r) for p, r in roles.items()],
    )


def _token(row: ApiTokenRow, user: str) -> TokenPublic:
    return TokenPublic(
        id=row.id,
        user=user,
        name=row.name,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )
