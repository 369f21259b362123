"""The dashboard's shell without a browser: which paths the page answers, and that a wheel
ships every static file (the package data globs cover them all)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from service.dashboard import pages

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", ["/", "/jobs", "/jobs/j123", "/cluster", "/no/such/page", "/v1x", "/uix"])
def test_page_paths_get_the_app(path):
    assert pages.is_page_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1",
        "/v1/jobs",
        "/v1/no-such-route",
        "/docs",
        "/redoc",
        "/openapi.json",
        "/healthz",
        "/livez",
        "/ui/app.css",
        "/ui/x",
    ],
)
def test_api_and_file_paths_never_get_the_app(path):
    assert not pages.is_page_path(path)


def test_an_overlong_page_path_is_not_the_app():
    assert not pages.is_page_path("/" + "a" * pages.MAX_PAGE_PATH)


def test_the_package_data_ships_every_static_file():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["service.dashboard"]
    root = pages.STATIC.parent
    files = [p.relative_to(root).as_posix() for p in pages.STATIC.rglob("*") if p.is_file()]
    assert {"static/index.html", "static/vendor/uplot/uPlot.iife.min.js", "static/vendor/uplot/LICENSE"} <= set(files)
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)] == []
