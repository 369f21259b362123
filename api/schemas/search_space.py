"""A search space: distributions over dotted field paths of a training spec, and how
sampled values are put into a spec."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from api.schemas.common import FreeJsonList, Strict

MAX_VALUES = 1000  # values in one choice or grid entry


class Uniform(Strict):
    type: Literal["uniform"] = Field(description="Uniform between low and high.")
    low: float = Field(description="Lower bound.")
    high: float = Field(description="Upper bound (greater than low).")

    @model_validator(mode="after")
    def _ordered(self) -> "Uniform":
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


class LogUniform(Strict):
    type: Literal["loguniform"] = Field(description="Uniform in log space: for learning rates and weight decays.")
    low: float = Field(gt=0.0, description="Lower bound (positive).")
    high: float = Field(gt=0.0, description="Upper bound (greater than low).")

    @model_validator(mode="after")
    def _ordered(self) -> "LogUniform":
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


class Choice(Strict):
    type: Literal["choice"] = Field(description="One of the values, drawn at random.")
    values: FreeJsonList = Field(min_length=1, max_length=MAX_VALUES, description="The values to choose from.")


class Grid(Strict):
    type: Literal["grid"] = Field(description="Every value in turn: the search runs each one.")
    values: FreeJsonList = Field(min_length=1, max_length=MAX_VALUES, description="The values to run.")


Distribution = Annotated[Union[Uniform, LogUniform, Choice, Grid], Field(discriminator="type")]
CONTINUOUS = (Uniform, LogUniform)


def apply_values(spec: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a dumped spec with each dotted path set to its value. A float put
    into an integer field is rounded (PBT multiplies values by its perturbation
    factors; a batch size must stay whole)."""
    out = copy.deepcopy(spec)
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        old = node.get(leaf)
        if isinstance(old, int) and not isinstance(old, bool) and isinstance(value, float):
            value = int(round(value))
        node[leaf] = value
    return out


def clip_to_space(values: dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    """Keep perturbed continuous values inside their distribution's bounds: PBT's
    multiplications would otherwise walk a learning rate out of any sane range."""
    out = dict(values)
    for path, dist in space.items():
        if isinstance(dist, CONTINUOUS) and isinstance(out.get(path), (int, float)) and not isinstance(out[path], bool):
            out[path] = type(out[path])(min(max(out[path], dist.low), dist.high))
    return out
