"""The remembered token lookups of the request guard (service/tenancy/caller_cache.py,
service/http/auth.py) on a real store: a revocation through this process takes effect at
once; one made elsewhere (another replica, by hand) within RAYDOCK_TOKEN_CACHE_S; a
remembered caller never outlives its token."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import update

from api.errors import Unauthorized
from api.schemas.tenancy import TokenCreate, UserCreate
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import utcnow
from service.db.tenancy_models import ApiTokenRow
from service.http.auth import Authenticator
from service.tenancy.caller import Caller
from service.tenancy.caller_cache import CallerCache, Revision
from service.tenancy.projects import Projects
from service.tenancy.tokens import token_hash
from service.tenancy.users import Users

ADMIN = Caller("admin", None, True)
TTL_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('callers') / 'store.db'}")
    sessions = make_sessionmaker(engine)
    users, projects = Users(sessions), Projects(sessions)
    projects.create("vision", ADMIN)
    for name in ("ann", "bob", "cid"):
        users.create(UserCreate(name=name, project="vision", role="member"), actor="admin")
    yield sessions
    engine.dispose()


@pytest.fixture()
def world(sessions):
    """This process's users and projects, sharing one revision, and an authenticator bound to them."""
    users = Users(sessions)
    projects = Projects(sessions, users.revision)
    auth = Authenticator(None, TTL_S)
    auth.bind(sessions, users.local_mode, users.revision)
    auth.callers.clock = Clock()
    return users, projects, auth


def who(auth: Authenticator, token: str) -> Caller | Unauthorized:
    return asyncio.run(auth.caller(f"Bearer {token}"))


def test_a_token_revoked_through_this_process_stops_at_once(world):
    users, _, auth = world
    made = users.create_token("ann", TokenCreate(name="t1"), actor="admin")
    assert who(auth, made.token).name == "ann"
    assert len(auth.callers) == 1  # remembered
    users.revoke_token("ann", made.id, actor="admin")
    assert isinstance(who(auth, made.token), Unauthorized)


def test_a_token_revoked_elsewhere_stops_within_the_cache_bound(world, sessions):
    users, _, auth = world
    made = users.create_token("bob", TokenCreate(name="t2"), actor="admin")
    assert who(auth, made.token).name == "bob"
    Users(sessions).revoke_token("bob", made.id, actor="admin")  # another replica: a revision of its own
    served_stale = who(auth, made.token)
    auth.callers.clock.now += TTL_S
    refused = who(auth, made.token)
    assert served_stale.name == "bob"  # remembered: what the bound is for
    assert isinstance(refused, Unauthorized)


def test_a_member_removed_through_this_process_loses_the_project_at_once(world):
    users, projects, auth = world
    made = users.create_token("cid", TokenCreate(name="t3"), actor="admin")
    assert who(auth, made.token).can_read("vision")
    projects.remove_member("vision", "cid", ADMIN)
    after = who(auth, made.token)
    assert after.name == "cid" and not after.can_read("vision")


def test_a_remembered_caller_never_outlives_its_token(world, sessions):
    users, _, auth = world
    made = users.create_token("ann", TokenCreate(name="t4", expires_in_days=1), actor="admin")
    with sessions.begin() as s:  # it expires in a second, as the store says
        s.execute(
            update(ApiTokenRow).where(ApiTokenRow.id == made.id).values(expires_at=utcnow() + timedelta(seconds=1))
        )
    assert who(auth, made.token).name == "ann"
    remembered = auth.callers.get(token_hash(made.token))
    auth.callers.clock.now += 1.0  # well inside the cache's 30 s
    assert remembered is not None and remembered.name == "ann"
    assert auth.callers.get(token_hash(made.token)) is None  # the next request reads the store, which refuses it


def test_unknown_tokens_are_not_remembered_and_the_cache_is_bounded():
    cache = CallerCache(TTL_S, Revision(), clock=Clock())
    for i in range(10_050):
        cache.put(f"digest-{i}", ADMIN, 0)
    assert len(cache) == 10_000
    assert cache.get("digest-0") is None and cache.get("digest-10049") is ADMIN
    off = CallerCache(0.0, Revision())
    off.put("d", ADMIN, 0)
    assert off.get("d") is None  # RAYDOCK_TOKEN_CACHE_S=0: every request looks its token up
