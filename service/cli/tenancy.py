"""``raydock user|project|token ...``: users, projects with their members, and API tokens,
over the SDK (server admins manage users and projects; a user manages their own tokens)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from api.schemas.tenancy import Role
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console

users = typer.Typer(help="Users (server admin): create, list, revoke.", no_args_is_help=True)
projects = typer.Typer(help="Projects and their members.", no_args_is_help=True)
tokens = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)

RoleOpt = Annotated[str, typer.Option("--role", help="admin, member or viewer.")]
UserOpt = Annotated[
    Optional[str], typer.Option("--user", help="Whose tokens (default: the token's own user, GET /v1/me).")
]


def _role(value: str) -> Role:
    if value not in ("admin", "member", "viewer"):
        raise typer.BadParameter(f"{value!r} is no role; use admin, member or viewer.", param_hint="--role")
    return value  # type: ignore[return-value]


@users.command("create")
def user_create(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="A server admin.")] = False,
    project: Annotated[Optional[str], typer.Option("--project", help="Add the user to this project.")] = None,
    role: RoleOpt = "member",
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Create a user (and, with --project, their membership); print their first token."""
    with client_for(url, token) as client:
        client.create_user(name, admin=admin, project=project, role=_role(role))
        created = client.create_token(name, name="first")
    console.print(escape(f"created user {name}; token (shown once): {created.token}"), highlight=False)


@users.command("list")
def user_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Users with their projects and roles."""
    with client_for(url, token) as client:
        found = client.users()
    table = Table("NAME", "ADMIN", "PROJECTS", "CREATED")
    for u in found:
        roles = ", ".join(f"{m.project}:{m.role}" for m in u.projects)
        table.add_row(u.name, "yes" if u.admin else "", roles, u.created_at.isoformat(timespec="seconds"))
    console.print(table)


@users.command("revoke")
def user_revoke(name: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Delete a user: their tokens stop working now (their jobs stay with their projects)."""
    with client_for(url, token) as client:
        client.delete_user(name)
    console.print(escape(f"deleted user {name}"))


@projects.command("create")
def project_create(name: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    with client_for(url, token) as client:
        client.create_project(name)
    console.print(escape(f"created project {name}"))


@projects.command("list")
def project_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Your projects (a server admin: all) with their members."""
    with client_for(url, token) as client:
        found = client.projects()
    table = Table("NAME", "MEMBERS", "CREATED")
    for p in found:
        members = ", ".join(f"{u}:{r}" for u, r in p.members.items())
        table.add_row(p.name, members, p.created_at.isoformat(timespec="seconds"))
    console.print(table)


@projects.command("add-member")
def project_add_member(
    project: str, user: str, role: RoleOpt = "member", url: UrlOpt = DEFAULT_URL, token: TokenOpt = None
) -> None:
    """Add a user to a project, or change their role."""
    with client_for(url, token) as client:
        client.set_member(project, user, _role(role))
    console.print(escape(f"{user} is {role} in {project}"))


@projects.command("remove-member")
def project_remove_member(project: str, user: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    with client_for(url, token) as client:
        client.remove_member(project, user)
    console.print(escape(f"removed {user} from {project}"))


@tokens.command("create")
def token_create(
    user: UserOpt = None,
    name: Annotated[str, typer.Option("--name", help="A label to tell tokens apart.")] = "token",
    expires_in_days: Annotated[
        Optional[float],
        typer.Option(
            "--expires-in-days",
            help="Days until it stops working; left out: the longest the server allows (RAYDOCK_MAX_TOKEN_TTL_DAYS, "
            "and never past the token you create it with).",
        ),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """A new token (printed once: the server keeps only its hash)."""
    with client_for(url, token) as client:
        created = client.create_token(user or client.me().name, name=name, expires_in_days=expires_in_days)
    console.print(created.token, highlight=False)


@tokens.command("list")
def token_list(user: UserOpt = None, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    with client_for(url, token) as client:
        found = client.tokens(user or client.me().name)
    table = Table("ID", "NAME", "CREATED", "EXPIRES", "REVOKED")
    for t in found:
        at = [x.isoformat(timespec="seconds") if x else "" for x in (t.created_at, t.expires_at, t.revoked_at)]
        table.add_row(str(t.id), t.name, *at)
    console.print(table)


@tokens.command("revoke")
def token_revoke(token_id: int, user: UserOpt = None, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Revoke a token by its id (raydock token list): the next request with it is refused."""
    with client_for(url, token) as client:
        client.revoke_token(user or client.me().name, token_id)
    console.print(f"revoked token {token_id}")
