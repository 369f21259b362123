"""A real headless Chromium (Debian's, driven by Playwright) for the dashboard's tests: the
browser, a tab that fails its test on any console or page error, screenshots to
$RAYDOCK_TEST_ARTIFACTS (default /tmp/raydock-screenshots). ``tests/setup_browser.sh``
installs Chromium when it is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("RAYDOCK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("RAYDOCK_TEST_ARTIFACTS") or "/tmp/raydock-screenshots")
WAIT_MS = 180_000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run tests/setup_browser.sh (or set RAYDOCK_CHROMIUM)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Tab:
    """A page that records every console error and page error; ``expect`` names the
    errors a test provokes on purpose (a refused token's 401)."""

    def __init__(self, browser, **context):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True, **context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.expected: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(x in e for x in self.expected)]

    def shot(self, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture()
def tab(browser):
    t = Tab(browser)
    yield t
    t.context.close()
    assert t.unexpected() == [], "console errors"
