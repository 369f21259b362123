"""What each tracker accepts, and the bounds raydock keeps: metric names sanitised to a
tool's alphabet and length, only finite numbers as values, a bounded number of keys per
report, a job spec flattened to ``a.b.c`` params, and the names raydock gives what it
makes: a trial's TensorBoard folder (never the trial id, which the job chose) and a
project's MLflow experiment."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Iterator

MAX_KEYS_PER_REPORT = 200  # metric keys exported from one report; the rest are left out
MAX_PARAMS = 500  # spec params logged to MLflow
MLFLOW_KEY_CHARS, MLFLOW_VALUE_CHARS = 250, 6000  # MLflow's own limits on a param or metric key, a param value
TENSORBOARD_TAG_CHARS = 200
SKIPPED = frozenset({"step"})  # the x-axis of every series, not a series itself

_MLFLOW_BAD = re.compile(r"[^\w./\- :]")  # MLflow: alphanumerics, _ - . / space and :
_TENSORBOARD_BAD = re.compile(r"[^\w./\-]")


def trial_folder(trial_id: str) -> str:
    """A trial's run folder under ``tensorboard/``: a hash of its id, so no id is ever a path."""
    return "trial-" + hashlib.sha256(trial_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def mlflow_experiment(project: str, experiment: str) -> str:
    """The MLflow experiment of a spec's ``tracking.mlflow.experiment`` in ``project``: one
    namespace per project (a project name holds no ``/``, so no two projects share one)."""
    return f"{project}/{experiment}"


def mlflow_key(name: str) -> str:
    return _MLFLOW_BAD.sub("_", name)[:MLFLOW_KEY_CHARS] or "_"


def tensorboard_tag(name: str) -> str:
    return _TENSORBOARD_BAD.sub("_", name)[:TENSORBOARD_TAG_CHARS] or "_"


def scalar(value: Any) -> float | None:
    """A finite number as a float; None for anything else (text, booleans, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def scalars(values: dict[str, Any]) -> dict[str, float]:
    """A report's exportable series: its finite numbers but the step, at most MAX_KEYS_PER_REPORT, by name."""
    out: dict[str, float] = {}
    for key in sorted(values):
        if key in SKIPPED:
            continue
        if (v := scalar(values[key])) is not None:
            out[key] = v
            if len(out) >= MAX_KEYS_PER_REPORT:
                break
    return out


def flatten(spec: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``{"optimizer": {"lr": 0.01}}`` -> ``("optimizer.lr", "0.01")``; lists as JSON."""
    if isinstance(spec, dict):
        for key in sorted(spec, key=str):
            yield from flatten(spec[key], f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        text = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True, default=str)
        yield prefix, text


def params(spec: dict[str, Any]) -> dict[str, str]:
    """The spec as MLflow params: sanitised keys, values cut to MLflow's limit, at most MAX_PARAMS."""
    out: dict[str, str] = {}
    for key, value in flatten(spec):
        if value in ("", "null"):
            continue  # an unset field says nothing
        out.setdefault(mlflow_key(key), value[:MLFLOW_VALUE_CHARS])
        if len(out) >= MAX_PARAMS:
            break
    return out
