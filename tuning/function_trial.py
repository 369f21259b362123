"""The trainable of a search whose base is a Ray Tune function trainable (``trainable:
function``). This module imports neither torch nor Ray Train's trainers: a trial's
process imports ray.tune and the user's function, nothing more."""

from __future__ import annotations

import inspect
from typing import Any

from api.schemas import TuneSpec
from trainers.failures import TrialFailed, classify
from trainers.user_loop import load_entrypoint


def run_function_trial(config: dict[str, Any], *, spec: dict[str, Any]) -> Any:
    """The trainable of a search whose base is a Ray Tune function trainable
    (``trainable: function``): the user's function, called with the trial's ``config``
    (base.config with the searched values put in). It reports with ``tune.report`` and
    restores with ``tune.get_checkpoint()`` itself; its errors read as its own."""
    trial_spec = TuneSpec.model_validate(spec).trial_spec(config)
    fn = load_entrypoint(trial_spec.entrypoint)
    try:
        return fn(dict(trial_spec.config)) if inspect.signature(fn).parameters else fn()
    except Exception as exc:  # noqa: BLE001 - classified, as a Train loop's failure is
        why = classify(exc)
        raise TrialFailed(why.cause.value, why.message, why.traceback) from None
