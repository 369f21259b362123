"""Routes of users and their API tokens. Users are the server admin's to create, list and
delete; a user's tokens are theirs and the server admin's: create (the token is in the
answer, once), list and revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from starlette.concurrency import run_in_threadpool

from api.errors import admin_only
from api.schemas import INT64_MAX
from api.schemas.tenancy import USER_RE, TokenCreate, TokenCreated, TokenPublic, UserCreate, UserPublic
from service.http.deps import CurrentCaller, UsersDep
from service.http.openapi import errors
from service.tenancy.caller import Caller

router = APIRouter(tags=["users"])

UserPath = Annotated[str, Path(pattern=USER_RE, description="The user's name.")]
TokenId = Annotated[int, Path(ge=1, le=INT64_MAX, description="The token's id (GET /v1/users/{name}/tokens).")]


def _server_admin(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise admin_only(what)


def _admin_or_self(caller: Caller, name: str) -> None:
    if not caller.admin and caller.name != name:
        raise admin_only("Managing another user's tokens")


@router.post(
    "/users",
    status_code=201,
    response_model=UserPublic,
    operation_id="create_user",
    responses=errors(403, 404, 409, 422),
)
async def create_user(users: UsersDep, caller: CurrentCaller, body: UserCreate) -> UserPublic:
    """Create a user (server admin). Give them a token next: POST /v1/users/{name}/tokens.
    `admin` and `system` are reserved (422 `user_name_reserved`)."""
    _server_admin(caller, "Creating a user")
    return await run_in_threadpool(users.create, body, actor=caller.name)


@router.get("/users", response_model=list[UserPublic], operation_id="list_users", responses=errors(403))
async def list_users(users: UsersDep, caller: CurrentCaller) -> list[UserPublic]:
    _server_admin(caller, "Listing users")
    return await run_in_threadpool(users.list)


@router.delete("/users/{name}", status_code=204, operation_id="delete_user", responses=errors(403, 404, 409, 422))
async def delete_user(users: UsersDep, caller: CurrentCaller, name: UserPath) -> Response:
    """Delete a user with their tokens and memberships (their jobs stay with their projects)."""
    _server_admin(caller, "Deleting a user")
    await run_in_threadpool(users.delete, name, actor=caller.name)
    return Response(status_code=204)


@router.post(
    "/users/{name}/tokens",
    status_code=201,
    response_model=TokenCreated,
    operation_id="create_token",
    responses=errors(403, 404, 409, 422),
)
async def create_token(users: UsersDep, caller: CurrentCaller, name: UserPath, body: TokenCreate) -> TokenCreated:
    """A new token for the user (the server admin's, or the user's own): shown in this
    answer only; the server keeps its sha256. It lives `expires_in_days`, or as long as
    allowed: at most the server's longest token lifetime, and never past the expiry of the
    user token this request is sent with (422 `token_lifetime_too_long` past either)."""
    _admin_or_self(caller, name)
    return await run_in_threadpool(users.create_token, name, body, actor=caller.name, not_after=caller.token_expires_at)


@router.get(
    "/users/{name}/tokens",
    response_model=list[TokenPublic],
    operation_id="list_tokens",
    responses=errors(403, 404, 422),
)
async def list_tokens(users: UsersDep, caller: CurrentCaller, name: UserPath) -> list[TokenPublic]:
    _admin_or_self(caller, name)
    return await run_in_threadpool(users.tokens, name)


@router.delete(
    "/users/{name}/tokens/{token_id}", status_code=204, operation_id="revoke_token", responses=errors(403, 404, 422)
)
async def revoke_token(users: UsersDep, caller: CurrentCaller, name: UserPath, token_id: TokenId) -> Response:
    """Revoke a token: the next request that sends it is a 401."""
    _admin_or_self(caller, name)
    await run_in_threadpool(users.revoke_token, name, token_id, actor=caller.name)
    return Response(status_code=204)
