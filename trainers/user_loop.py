"""The per-worker loop of a user-code job: import the user's entrypoint in the Train
worker and run it.

The job's driver never imports the user's code; it hands Ray Train
``partial(run_user_loop, "package.module:function")``, which travels by name. In the
worker the names the job's code shares with raydock's packages go back to the job's
code first (``trainers.own_imports.yield_to_job``), so a user directory holding
``api/`` or ``service/`` imports its own.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

from trainers.own_imports import yield_to_job


def load_entrypoint(entrypoint: str) -> Callable[..., Any]:
    module_name, fn_name = entrypoint.split(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise AttributeError(f"entrypoint {entrypoint!r}: module {module_name!r} has no function {fn_name!r}")
    return fn


def run_user_loop(entrypoint: str, config: dict) -> Any:
    yield_to_job()
    fn = load_entrypoint(entrypoint)
    # Ray Train's rule for a loop: one parameter gets the config, none gets nothing.
    return fn(config) if inspect.signature(fn).parameters else fn()


def user_loop(entrypoint: str) -> Callable[[dict], Any]:
    """The loop to hand Ray Train for ``entrypoint``."""
    return functools.partial(run_user_loop, entrypoint)
