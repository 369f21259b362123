"""Which project a request acts in: a submit's (the spec's ``project``, else the caller's
default project) and a code package request's (the ``project`` query, else the same
default). A project the caller may not use reads as missing: 404 ``project_not_found``,
never a 403 that would confirm it exists."""

from __future__ import annotations

from api.errors import NotFound, project_not_found
from service.tenancy.caller import Caller
from service.tenancy.projects import Projects


def no_project() -> NotFound:
    return NotFound(
        "You are in no project where you may do this; ask a server admin or a project admin to add you "
        "(raydock project add-member PROJECT USER).",
        code="project_not_found",
    )


def write_project(caller: Caller, requested: str | None, projects: Projects) -> str:
    """The project a submit or an upload goes to; the caller is a member or admin there.
    Runs off the event loop (a server admin's project is looked up)."""
    project = requested or caller.default_project
    if project is None:
        raise no_project()
    if not caller.can_write(project) or (caller.admin and not projects.exists(project)):
        raise project_not_found(project)
    return project


def read_project(caller: Caller, requested: str | None, projects: Projects) -> str:
    """The project whose code packages a read looks at; any role there."""
    project = requested or caller.default_project or next(iter(caller.roles), None)
    if project is None:
        raise no_project()
    if not caller.can_read(project) or (caller.admin and not projects.exists(project)):
        raise project_not_found(project)
    return project
