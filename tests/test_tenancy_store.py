"""Users, tokens and projects on the store itself (SQLite and the session's PostgreSQL):
a token is held only as its sha256 and shown once; revoked and expired tokens name
nobody; the first start writes the admin's token to a 0600 file once; a project keeps
an admin of its own; a caller's roles decide what it may read, write and manage."""

from __future__ import annotations

import stat
from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import inspect, select, text, update

from api.errors import Conflict, Forbidden, InvalidSpec, NotFound
from api.schemas import parse_job_spec
from api.schemas.tenancy import MAX_TOKENS_PER_USER, RESERVED_USER_NAMES, TokenCreate, UserCreate
from bench.harness.specs import digits_spec
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import utcnow
from service.db.tenancy_models import ApiTokenRow
from service.settings import Settings
from service.tenancy.bootstrap import TOKEN_FILE, bootstrap
from service.tenancy.caller import Caller, authenticate, server_admin
from service.tenancy.projects import Projects
from service.tenancy.tokens import token_hash
from service.tenancy.users import Users

ADMIN = Caller("admin", None, True)


@pytest.fixture()
def sessions(database_url):
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def every_stored_value(sessions) -> str:
    """Every value of every table, as text: what someone holding the database file sees."""
    with sessions() as s:
        names = inspect(s.get_bind()).get_table_names()
        return "\n".join(repr(row) for t in names for row in s.execute(text(f'SELECT * FROM "{t}"')))


@pytest.mark.slow  # seconds: a fresh store, every migration, on both databases
def test_a_token_is_stored_as_its_hash_and_shown_once(sessions):
    users = Users(sessions)
    users.create(UserCreate(name="ann"), actor="admin")
    made = users.create_token("ann", TokenCreate(name="laptop"), actor="admin")
    assert made.token.startswith("rdk_") and len(made.token) >= 40
    stored = every_stored_value(sessions)
    assert made.token not in stored and made.token[4:20] not in stored
    assert token_hash(made.token) in stored
    assert all("token" not in t.model_dump() for t in users.tokens("ann"))  # listed without the secret
    caller = authenticate(sessions, made.token)
    assert caller is not None and caller.name == "ann" and not caller.admin
    assert authenticate(sessions, made.token[:-1] + ("A" if made.token[-1] != "A" else "B")) is None

    revoked_and_expired_tokens_name_nobody(sessions)
    tokens_per_user_are_capped(sessions)


def revoked_and_expired_tokens_name_nobody(sessions):
    users = Users(sessions)
    users.create(UserCreate(name="bob"), actor="admin")
    revoked = users.create_token("bob", TokenCreate(), actor="admin")
    expiring = users.create_token("bob", TokenCreate(expires_in_days=1), actor="admin")
    assert authenticate(sessions, revoked.token) is not None and authenticate(sessions, expiring.token) is not None
    users.revoke_token("bob", revoked.id, actor="admin")
    with sessions.begin() as s:
        past = utcnow() - timedelta(seconds=1)
        s.execute(update(ApiTokenRow).where(ApiTokenRow.id == expiring.id).values(expires_at=past))
    assert authenticate(sessions, revoked.token) is None
    assert authenticate(sessions, expiring.token) is None
    with pytest.raises(NotFound) as missing:
        users.revoke_token("admin-less", revoked.id, actor="admin")
    assert missing.value.code == "user_not_found"


def tokens_per_user_are_capped(sessions):
    users = Users(sessions)
    users.create(UserCreate(name="cap"), actor="admin")
    for _ in range(MAX_TOKENS_PER_USER):
        users.create_token("cap", TokenCreate(), actor="admin")
    with pytest.raises(Conflict) as refused:
        users.create_token("cap", TokenCreate(), actor="admin")
    assert refused.value.code == "too_many_tokens"


@pytest.mark.slow  # seconds: a fresh store, every migration, on both databases
def test_first_start_writes_the_admin_token_once_to_a_private_file(sessions, tmp_path):
    settings = Settings(storage={"data_dir": tmp_path / "data"})
    settings.storage.prepare_data_dir()
    path = bootstrap(sessions, settings.storage.data_dir)
    assert path == settings.storage.data_dir / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.storage.data_dir.stat().st_mode) == 0o700
    token = path.read_text().strip()
    caller = authenticate(sessions, token)
    assert caller is not None and caller.name == "admin" and caller.admin
    assert bootstrap(sessions, settings.storage.data_dir) is None  # a restart makes no second token
    assert path.read_text().strip() == token
    assert server_admin(sessions).admin


@pytest.mark.slow  # seconds: a fresh store, every migration, on both databases
def test_a_project_keeps_an_admin_and_members_change_only_by_its_admins(sessions, tmp_path):
    users_other_than_admin_end_local_mode_and_the_last_admin_stays(sessions, tmp_path)
    users, projects = Users(sessions), Projects(sessions)
    projects.create("vision", ADMIN)
    users.create(UserCreate(name="lead", project="vision", role="admin"), actor="admin")
    users.create(UserCreate(name="dev", project="vision"), actor="admin")
    users.create(UserCreate(name="stranger"), actor="admin")
    lead = Caller("lead", None, False, {"vision": "admin"})
    dev = Caller("dev", None, False, {"vision": "member"})
    stranger = Caller("stranger", None, False, {})
    assert projects.set_member("vision", "stranger", "viewer", lead).members["stranger"] == "viewer"
    with pytest.raises(Forbidden) as member:
        projects.set_member("vision", "stranger", "member", dev)
    with pytest.raises(NotFound) as outsider:
        projects.set_member("vision", "dev", "viewer", stranger)
    with pytest.raises(Conflict) as last:
        projects.set_member("vision", "lead", "member", lead)
    assert (member.value.code, outsider.value.code, last.value.code) == (
        "forbidden_role",
        "project_not_found",
        "last_project_admin",
    )
    assert [p.name for p in projects.list(dev)] == ["vision"] and projects.list(stranger) == []


def test_roles_decide_reads_writes_and_the_default_project():
    user = Caller("u", 1, False, {"ro": "viewer", "rw": "member", "own": "admin"})
    assert [user.can_read(p) for p in ("ro", "rw", "own", "else")] == [True, True, True, False]
    assert [user.can_write(p) for p in ("ro", "rw", "own")] == [False, True, True]
    assert [user.can_manage(p) for p in ("ro", "rw", "own")] == [False, False, True]
    assert user.default_project == "rw"  # the first project joined where they may submit
    assert user.projects == ["ro", "rw", "own"]
    assert ADMIN.projects is None and ADMIN.default_project == "default"
    assert Caller("v", 2, False, {"ro": "viewer"}).default_project is None


def users_other_than_admin_end_local_mode_and_the_last_admin_stays(sessions, data_dir):
    bootstrap(sessions, data_dir)  # the server admin ``admin`` and its token
    users = Users(sessions)
    assert users.local_mode.ended() is False
    users.create(UserCreate(name="carol"), actor="admin")
    assert users.local_mode.ended() is False  # carol cannot sign in yet: her first token comes next, still local
    users.create_token("carol", TokenCreate(name="first"), actor="admin")
    assert users.local_mode.ended() is True
    with pytest.raises(Conflict) as last:
        users.delete("admin", actor="admin")
    assert last.value.code == "last_admin"
    users.delete("carol", actor="admin")
    assert Users(sessions).local_mode.ended() is True  # once over, for good: another process reads it so too
    with sessions() as s:
        assert [t.name for t in s.scalars(select(ApiTokenRow))] == ["bootstrap"]


@pytest.mark.slow  # seconds: a fresh store, every migration, on both databases
def test_reserved_names_and_token_lifetimes(sessions):
    """``admin`` and ``system`` are nobody's to take; a token lives at most the server's
    longest lifetime and never past the token that made it."""
    users = Users(sessions, max_token_ttl_days=10)
    for name in RESERVED_USER_NAMES:
        with pytest.raises(InvalidSpec) as reserved:
            users.create(UserCreate(name=name), actor="admin")
        assert reserved.value.code == "user_name_reserved"
    users.create(UserCreate(name="dora"), actor="admin")
    longest = users.create_token("dora", TokenCreate(), actor="admin")
    assert longest.expires_at - longest.created_at == timedelta(days=10)
    with pytest.raises(InvalidSpec) as too_long:
        users.create_token("dora", TokenCreate(expires_in_days=11), actor="admin")
    maker = utcnow() + timedelta(hours=1)
    bounded = users.create_token("dora", TokenCreate(), actor="dora", not_after=maker)
    with pytest.raises(InvalidSpec) as past_maker:
        users.create_token("dora", TokenCreate(expires_in_days=1), actor="dora", not_after=maker)
    assert bounded.expires_at == maker
    assert too_long.value.code == past_maker.value.code == "token_lifetime_too_long"
    assert "RAYDOCK_MAX_TOKEN_TTL_DAYS" in too_long.value.message and "expires at" in past_maker.value.message
    caller = authenticate(sessions, bounded.token)
    assert caller is not None and caller.token_expires_at is not None


def test_a_search_names_its_project_on_the_search_not_on_its_base():
    base = {k: v for k, v in digits_spec().items() if k not in ("name", "epochs", "checkpoint")}
    search = {
        "kind": "tune",
        "name": "s",
        "base": base,
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
        "algorithm": "random",
        "metric": "val_acc",
        "mode": "max",
        "num_trials": 2,
        "budget": {"epochs": 1},
    }
    assert parse_job_spec({**search, "project": "alpha"}).project == "alpha"
    with pytest.raises(ValidationError) as refused:
        parse_job_spec({**search, "base": {**base, "project": "alpha"}})
    assert "base.project" in str(refused.value)
    with pytest.raises(ValidationError):
        parse_job_spec(digits_spec(project="Not A Slug"))


@pytest.mark.slow  # seconds: every migration, on both databases
@pytest.mark.empty_database  # it migrates up from 0013 itself
def test_the_identity_migration_scopes_keys_by_project_and_keeps_local_mode_ended(database_url):
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    old = create_engine(database_url)
    job = (
        "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority, restarts,"
        " project, idempotency_key) VALUES (:id, 'n', 'train', 'QUEUED', '{}', '{}', '2026-01-01', 0, 0, 0, '[]',"
        " :project, :key)"
    )
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0013_start_phases")
        conn.execute(text("INSERT INTO projects (name, created_at) VALUES ('beta', '2026-01-01')"))
        conn.execute(text(job), {"id": "j1", "project": "default", "key": "nightly"})
        conn.execute(text("INSERT INTO users (id, name, is_admin, created_at) VALUES (7, 'ann', false, '2026-01-01')"))
        conn.execute(
            text("INSERT INTO api_tokens (user_id, token_hash, name, created_at) VALUES (7, :h, 't', '2026-01-01')"),
            {"h": "0" * 64},
        )
    old.dispose()
    engine = make_engine(database_url)  # up to the newest revision
    sessions = make_sessionmaker(engine)
    with sessions.begin() as s:
        again = job.replace("idempotency_key", "project_idempotency_key")
        s.execute(text(again), {"id": "j2", "project": "beta", "key": "nightly"})  # the same key, another project
        keys = dict(s.execute(text("SELECT id, project_idempotency_key FROM jobs")).all())
        assert s.execute(text("SELECT count(*) FROM jobs WHERE idempotency_key IS NOT NULL")).scalar() == 0
    assert keys == {"j1": "nightly", "j2": "nightly"}
    assert Users(sessions).local_mode.ended() is True  # ann held a token before the upgrade
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0013_start_phases")
        kept = conn.execute(text("SELECT id, idempotency_key FROM jobs ORDER BY id")).all()
    assert [tuple(r) for r in kept] == [("j1", "nightly"), ("j2", None)]  # one job of the key keeps it
    engine.dispose()
