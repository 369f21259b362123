"""Who a request is, decided once by the request guard before any route runs (so no body
is read for a caller that is refused) and kept on the request for the routes.

- ``Authorization: Bearer <RAYDOCK_API_TOKEN>``: the server admin ``admin``.
- ``Authorization: Bearer rdk_...``: the user that token belongs to, while it is neither
  revoked nor expired; the answer is remembered for RAYDOCK_TOKEN_CACHE_S seconds at most
  (``service/tenancy/caller_cache.py`` says when a revocation takes effect).
- No token, on loopback with no RAYDOCK_API_TOKEN set (local mode): the server admin,
  until a user other than ``admin`` is first given a token; from then on, for good, every
  request says who it is (``service/tenancy/local_mode.py``).
Anything else is a 401."""

from __future__ import annotations

import secrets

from anyio import to_thread
from sqlalchemy.orm import sessionmaker

from api.errors import Unauthorized
from service.tenancy.caller import Caller, authenticate, server_admin
from service.tenancy.caller_cache import CallerCache, Revision
from service.tenancy.local_mode import LocalMode
from service.tenancy.tokens import looks_like_token, token_hash

UNAUTHORIZED = (
    "Missing, wrong, revoked or expired API token. Send 'Authorization: Bearer <token>' with a user token "
    "(raydock token create) or RAYDOCK_API_TOKEN."
)


def token_matches(token: str | None, expected: str | None) -> bool:
    """Constant-time token check that refuses (instead of raising on) non-ASCII input."""
    if not token or not expected or not token.isascii():
        return False
    return secrets.compare_digest(token.encode(), expected.encode())


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and token.isascii() else None


async def local_mode_ended(mode: LocalMode) -> bool:
    """Whether local mode is over, read off the event loop when the cached answer is stale."""
    ended = mode.ended_cached()
    return ended if ended is not None else await to_thread.run_sync(mode.ended)


class Authenticator:
    """Made with the app, before the lifespan builds the runtime; the lifespan then hands it
    the store, local mode and the revision of users and memberships by name (``bind``),
    before any request is served."""

    def __init__(self, api_token: str | None, token_cache_s: float = 0.0) -> None:
        self.api_token = api_token
        self.token_cache_s = token_cache_s
        self.sessions: sessionmaker | None = None
        self.local_mode: LocalMode | None = None
        self.callers = CallerCache(0.0, Revision())
        self._admin: Caller | None = None

    def bind(self, sessions: sessionmaker, local_mode: LocalMode, revision: Revision | None = None) -> None:
        self.sessions, self.local_mode = sessions, local_mode
        self.callers = CallerCache(self.token_cache_s, revision or Revision())

    async def caller(self, authorization: str | None) -> Caller | Unauthorized:
        token = bearer_token(authorization)
        if self.api_token is not None and token_matches(token, self.api_token):
            return await self._server_admin()
        if looks_like_token(token):
            return await self._user(token)
        if self.api_token is None and not await local_mode_ended(self.local_mode):
            return await self._server_admin()  # local mode: as before users existed
        return Unauthorized(UNAUTHORIZED)

    async def _user(self, token: str) -> Caller | Unauthorized:
        digest = token_hash(token)
        if (known := self.callers.get(digest)) is not None:
            return known
        revision = self.callers.revision.value  # before the lookup: a change committed meanwhile makes it stale
        found = await to_thread.run_sync(authenticate, self.sessions, token)
        if found is None:
            return Unauthorized(UNAUTHORIZED)
        self.callers.put(digest, found, revision)
        return found

    async def _server_admin(self) -> Caller:
        # Its memberships rarely matter (a server admin reads every project); read once.
        if self._admin is None:
            self._admin = await to_thread.run_sync(server_admin, self.sessions)
        return self._admin
