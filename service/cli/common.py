"""What every ``raydock`` command shares: the app, the consoles, the server options and
how a refusal is printed."""

from __future__ import annotations

import importlib.util
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from api.client import Client
from service.cli.errors import Commands, err, server

# Locals stay out of a --debug traceback: they hold the API token.
app = typer.Typer(
    cls=Commands,
    help="raydock: distributed training and tuning jobs on Ray.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
console = Console()

UrlOpt = Annotated[str, typer.Option("--url", envvar="RAYDOCK_URL", help="Server URL.")]
TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="RAYDOCK_API_TOKEN", help="API token.")]
DEFAULT_URL = "http://127.0.0.1:8000"


@app.callback()
def options(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="RAYDOCK_DEBUG", help="Show the full traceback of a failure.")
    ] = False,
) -> None:
    """raydock: distributed training and tuning jobs on Ray."""
    ctx.meta["raydock.debug"] = debug


def client_for(url: str, token: str | None) -> Client:
    server.url, server.token_set = url, bool(token)  # what a failure's explanation names
    return Client(url, token=token)


# What `raydock serve`, `run` and `gc` need beyond the client (the `server` extra).
SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "ray", "torch")


def need_server(command: str) -> None:
    """Stop with what to install when this is the client-only install (``pip install raydock``)."""
    missing = [m for m in SERVER_MODULES if not _installed(m)]
    if missing:
        fail(
            f"`raydock {command}` runs the server side, which this install lacks ({', '.join(missing)}). "
            "Install it with: pip install 'raydock[server]'",
            code=2,
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(message)}")  # a message's [code] is text, not rich markup
    raise typer.Exit(code)
