"""How a command that failed tells its user: one or two lines saying what happened and
what to do, and a non-zero exit; the traceback only under ``raydock --debug``.

Every command runs inside ``Commands.invoke``, so a command body lets the SDK's errors
(``api.errors``) and httpx's transport errors rise, and they are all told the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from api.errors import InvalidSpec, NotFound, RaydockError, Unauthorized

EXIT_FAILED = 1  # the request failed: server unreachable, refused token, no such job...
EXIT_REFUSED = 2  # the input was refused (a spec, a value): change it and run again
MAX_FIELDS = 8  # field problems of a refused spec listed, at most

err = Console(stderr=True)  # what every command prints to stderr (service.cli.common re-exports it)


@dataclass
class Server:
    """The server this run of the CLI talks to (``common.client_for`` sets it): what an
    explanation names. One command runs per process, so one value is enough."""

    url: str | None = None
    token_set: bool = False


server = Server()


class Commands(TyperGroup):
    """The ``raydock`` group: turns a failed request into a short explanation."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RaydockError, httpx.HTTPError) as exc:
            if ctx.meta.get("raydock.debug"):
                raise
            lines, code = explain(exc, server.url, server.token_set)
            err.print(f"[red]error:[/red] {escape(lines[0])}")
            for line in lines[1:]:
                err.print(escape(line), highlight=False)
            raise typer.Exit(code) from None


def explain(exc: Exception, url: str | None, token_set: bool) -> tuple[list[str], int]:
    """What to print about ``exc`` (first line: what happened; then what to do) and the exit code."""
    where = _server(exc, url)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return [
            f"Cannot reach the raydock server at {where}.",
            "Start one with `raydock serve`, or point --url / RAYDOCK_URL at a running one.",
        ], EXIT_FAILED
    if isinstance(exc, httpx.TimeoutException):
        return [
            f"The raydock server at {where} did not answer in time.",
            "It may be busy or stuck: try again, and look at its log if it goes on.",
        ], EXIT_FAILED
    if isinstance(exc, httpx.UnsupportedProtocol):
        return [
            f"The server URL {url or where!r} has no http:// or https:// in front.",
            "Write --url / RAYDOCK_URL as http://HOST:PORT, e.g. http://127.0.0.1:8000.",
        ], EXIT_FAILED
    if isinstance(exc, httpx.HTTPError):
        why = str(exc).rstrip(".") or type(exc).__name__
        return [
            f"The connection to the raydock server at {where} failed: {why}.",
            "Check that --url / RAYDOCK_URL names a raydock server, then try again.",
        ], EXIT_FAILED
    assert isinstance(exc, RaydockError)
    if isinstance(exc, Unauthorized):
        if token_set:
            return [
                f"The server at {where} refused the API token (401).",
                "Set --token or RAYDOCK_API_TOKEN to a live token (raydock token create).",
            ], EXIT_FAILED
        return [
            f"The server at {where} needs an API token (401).",
            "Set --token or RAYDOCK_API_TOKEN (the admin's: <data dir>/admin-token).",
        ], EXIT_FAILED
    if exc.code == "quota_exceeded":
        return _quota(exc), EXIT_FAILED
    if exc.status == 429:
        wait = getattr(exc, "retry_after_s", None)
        return [
            f"The server is busy and refused the request (429): {exc.message}",
            f"Try again in {wait:g} s." if wait is not None else "Try again in a few seconds.",
        ], EXIT_FAILED
    if isinstance(exc, NotFound):
        hint = "`raydock list` shows the jobs there are." if "job" in exc.code else "Check the id and the --url."
        return [exc.message, hint], EXIT_FAILED
    if isinstance(exc, InvalidSpec) or exc.status == 422:
        return _refusal(exc), EXIT_REFUSED
    # 409 (the job's state forbids it), 503 (the cluster did not answer), the rest: the
    # server's message already says what to change.
    return [f"{exc.message} [{exc.code}]"], EXIT_REFUSED if exc.status in (400, 413) else EXIT_FAILED


def _quota(exc: RaydockError) -> list[str]:
    """A submit past its project's quota: which quota, how full, and who can raise it. No
    retry hint: the server is not busy, and the same submit is refused until the queue moves."""
    d = next((d for d in exc.details if d.get("quota")), None)
    if d is None:
        return [f"{exc.message} [{exc.code}]"]
    project, quota, limit = d.get("project", "?"), d["quota"], d.get("limit", "?")
    return [
        f"Project {project} is at its quota: {d.get('used', '?')} of {limit} jobs waiting to start ({quota}).",
        "That is a limit set for the project, not a busy server: the same submit is refused until some of its "
        "queued jobs have started (raydock list --status QUEUED) or you cancel some (raydock cancel JOB_ID).",
        f"To queue more, ask a server admin to raise the quota: raydock quota show {project}, then "
        f"raydock quota set {project} --max-queued N with its other limits (set replaces the whole quota).",
    ]


def _server(exc: Exception, url: str | None) -> str:
    """The server a failed request went to (its scheme, host and port)."""
    try:
        u = exc.request.url  # type: ignore[attr-defined]
        return f"{u.scheme}://{u.netloc.decode()}"
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError for an error without a request
        return url or "the server"


def _refusal(exc: RaydockError) -> list[str]:
    """A refused spec or request: what the server said, then each field to change on a
    line of its own (a validation message that already lists them is cut to its head)."""
    fields = [f"{_loc(d)}: {d.get('msg', '')}" for d in exc.details]
    message = exc.message
    listed = "; ".join(fields[:5])  # how the server's validation message ends (service/http/app.py)
    if listed and message.endswith(listed) and len(message) > len(listed):
        message = message[: -len(listed)].rstrip()
    else:
        fields = [f for f in fields if f not in message]
    lines = [f"{message} [{exc.code}]", *(f"  {f}" for f in fields[:MAX_FIELDS])]
    if len(fields) > MAX_FIELDS:
        lines.append(f"  ... and {len(fields) - MAX_FIELDS} more")
    return lines


def _loc(detail: dict[str, Any]) -> str:
    loc = detail.get("loc", "")
    if isinstance(loc, list | tuple):
        loc = ".".join(str(p) for p in loc)
    return str(loc) or "body"
