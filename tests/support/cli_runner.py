"""The ``raydock`` command line run in this process against a server (Typer's runner), as
a user with a token; wide enough that no line of a table is cut."""

from __future__ import annotations

from typer.testing import CliRunner


def cli(url: str, token: str, *args: str):
    from service.cli.common import console, err
    from service.cli.main import app

    console.width = err.width = 200
    return CliRunner().invoke(app, list(args), env={"RAYDOCK_API_TOKEN": token, "RAYDOCK_URL": url})
