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

from api.errors import Conflict, Forbidden, NotFound
from api.schemas import parse_job_spec
from api.schemas.tenancy import MAX_TOKENS_PER_USER, TokenCreate, UserCreate
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import utcnow
from service.db.tenancy_models import ApiTokenRow
from service.settings import Settings
from service.tenancy.bootstrap import TOKEN_FILE, bootstrap
from service.tenancy.caller import Caller, authenticate, server_admin
from service.tenancy.projects import Projects
from service.tenancy.tokens import token_hash
from service.tenancy.users import Users
from tests.conftest import digits_spec

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
    settings = Settings(data_dir=tmp_path / "data")
    settings.prepare_data_dir()
    path = bootstrap(sessions, settings.data_dir)
    assert path == settings.data_dir / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.data_dir.stat().st_mode) == 0o700
    token = path.read_text().strip()
    caller = authenticate(sessions, token)
    assert caller is not None and caller.name == "admin" and caller.admin
    assert bootstrap(sessions, settings.data_dir) is None  # a restart makes no second token
    assert path.read_text().strip() == token
    assert server_admin(sessions).admin


@pytest.mark.slow  # seconds: a fresh store, every migration, on both databases
def test_a_project_keeps_an_admin_and_members_change_only_by_its_admins(sessions):
    users_other_than_admin_end_local_mode_and_the_last_admin_stays(sessions)
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


def users_other_than_admin_end_local_mode_and_the_last_admin_stays(sessions):
    users = Users(sessions)
    users.create(UserCreate(name="admin", admin=True), actor="system")
    assert users.others_exist() is False
    users.create(UserCreate(name="carol"), actor="admin")
    assert users.others_exist() is False  # carol cannot sign in yet: her first token comes next, still local
    users.create_token("carol", TokenCreate(name="first"), actor="admin")
    assert users.others_exist() is True
    with pytest.raises(Conflict) as last:
        users.delete("admin", actor="admin")
    assert last.value.code == "last_admin"
    users.delete("carol", actor="admin")
    assert users.others_exist() is False
    with sessions() as s:
        assert s.scalars(select(ApiTokenRow)).all() == []


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
