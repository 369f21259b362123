"""``raydock ui``: the address of the web dashboard of the server the CLI talks to (the
API serves it at ``/``), and ``--open`` to open it in a browser."""

from __future__ import annotations

import webbrowser
from typing import Annotated

import typer

from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console, err


def ui(
    open_browser: Annotated[bool, typer.Option("--open", help="Open the dashboard in the default browser.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Print the web dashboard's URL (--open opens it)."""
    with client_for(url, token) as client:
        client.request("GET", "/healthz")  # an unreachable server is told now, not by a blank browser tab
        page = client.url + "/"
    console.print(page, highlight=False, soft_wrap=True)
    if token:
        # The token never goes into the URL: the page asks for it and keeps it for the tab.
        err.print("The page asks for the API token (the one in --token / RAYDOCK_API_TOKEN).")
    if open_browser and not webbrowser.open(page):
        err.print("No browser could be opened here: open the URL above on a machine that reaches the server.")
