"""Routes of projects and their members, and ``GET /v1/me``: who the caller is, with
their projects and roles. Projects are the server admin's to create; a project's admins
(and the server admin) set and remove its members."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from starlette.concurrency import run_in_threadpool

from api.schemas.tenancy import PROJECT_RE, USER_RE, Me, MemberSet, ProjectCreate, ProjectPublic
from service.http.deps import CurrentCaller, ProjectsDep
from service.http.openapi import errors

router = APIRouter(tags=["projects"])

ProjectPath = Annotated[str, Path(pattern=PROJECT_RE, description="The project's name.")]
UserPath = Annotated[str, Path(pattern=USER_RE, description="The user's name.")]


@router.get("/me", response_model=Me, operation_id="get_me")
async def me(caller: CurrentCaller) -> Me:
    """Who the token is: name, server admin or not, projects with roles, default project."""
    return caller.me()


@router.post(
    "/projects",
    status_code=201,
    response_model=ProjectPublic,
    operation_id="create_project",
    responses=errors(403, 409, 422),
)
async def create_project(projects: ProjectsDep, caller: CurrentCaller, body: ProjectCreate) -> ProjectPublic:
    """Create a project (server admin); add members with PUT /v1/projects/{name}/members/{user}."""
    return await run_in_threadpool(projects.create, body.name, caller)


@router.get("/projects", response_model=list[ProjectPublic], operation_id="list_projects")
async def list_projects(projects: ProjectsDep, caller: CurrentCaller) -> list[ProjectPublic]:
    """The caller's projects (a server admin: all) with their members."""
    return await run_in_threadpool(projects.list, caller)


@router.put(
    "/projects/{name}/members/{user}",
    response_model=ProjectPublic,
    operation_id="set_member",
    responses=errors(403, 404, 409, 422),
)
async def set_member(
    projects: ProjectsDep, caller: CurrentCaller, name: ProjectPath, user: UserPath, body: MemberSet
) -> ProjectPublic:
    """Add a user to the project, or change their role (a project admin or the server admin)."""
    return await run_in_threadpool(projects.set_member, name, user, body.role, caller)


@router.delete(
    "/projects/{name}/members/{user}",
    status_code=204,
    operation_id="remove_member",
    responses=errors(403, 404, 409, 422),
)
async def remove_member(projects: ProjectsDep, caller: CurrentCaller, name: ProjectPath, user: UserPath) -> Response:
    await run_in_threadpool(projects.remove_member, name, user, caller)
    return Response(status_code=204)
