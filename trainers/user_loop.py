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
import re
import warnings
from typing import Any, Callable

from trainers.own_imports import yield_to_job

# Ray's warning when Tune's session API is called with no Tune session (a Train worker
# has none): the call does nothing and returns None.
TUNE_SESSION_WARNING = r"`(\w+)` is meant to only be called inside a function that is executed by a Tuner"
TUNE_FUNCTION_MESSAGE = (
    "The loop called ray.tune.{call}(), Ray Tune's session API, inside a Ray Train worker, where it does "
    "nothing (no report arrives, no checkpoint is restored): this is a Ray Tune function trainable, not a "
    "Train loop. Search it with `trainable: function` (each trial then runs the function as a Tune "
    "trainable), or report with ray.train.report and restore with ray.train.get_checkpoint()."
)


class TuneFunctionInTrainLoop(RuntimeError):
    """A Train loop called Tune's session API (``tune.report``, ``tune.get_checkpoint``)."""


def refusing_tune_calls(loop: Callable[..., Any], *args: Any) -> Any:
    """Run ``loop(*args)`` in a Train worker, failing at once, with a message naming
    ``trainable: function``, when it calls Tune's session API: Ray would only log a
    warning and the run would go on silent."""
    from trainers.ray_compat import tune_session_calls_warn

    tune_session_calls_warn()
    warnings.filterwarnings("error", message=TUNE_SESSION_WARNING, category=UserWarning)
    try:
        return loop(*args)
    except UserWarning as exc:
        found = re.match(TUNE_SESSION_WARNING, str(exc))
        if found is None:
            raise
        raise TuneFunctionInTrainLoop(TUNE_FUNCTION_MESSAGE.format(call=found.group(1))) from None


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
    return refusing_tune_calls(fn, config) if inspect.signature(fn).parameters else refusing_tune_calls(fn)


def user_loop(entrypoint: str) -> Callable[[dict], Any]:
    """The loop to hand Ray Train for ``entrypoint``."""
    return functools.partial(run_user_loop, entrypoint)
