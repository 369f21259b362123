"""The options of a hyperparameter search: the per-trial budget (the schedulers' time
axis) and the settings of PBT/PB2 and ASHA. ``api.schemas.tune`` holds the search."""

from __future__ import annotations

from pydantic import Field, model_validator

from api.schemas.common import Strict
from api.schemas.search_space import Distribution

MAX_SEARCHED_FIELDS = 64


# The time axis of a loop that reports neither `epoch` nor `step`: Tune's own count of reports.
REPORTS_UNIT = "training_iteration"


class TrialBudget(Strict):
    epochs: int | None = Field(default=None, ge=1, le=100_000, description="Epochs each trial trains at most.")
    steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Optimizer steps each trial trains at most."
    )
    reports: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Reports (ray.train.report calls) each trial makes at most: for a loop that reports neither epoch nor step.",
    )

    @model_validator(mode="after")
    def _one_unit(self) -> "TrialBudget":
        if sum(v is not None for v in (self.epochs, self.steps, self.reports)) != 1:
            raise ValueError("give exactly one of budget.epochs, budget.steps or budget.reports")
        return self

    @property
    def unit(self) -> str:
        """The reported metric that counts the budget, and the schedulers' time axis."""
        return "epoch" if self.epochs is not None else "step" if self.steps is not None else REPORTS_UNIT

    @property
    def amount(self) -> int:
        return next(v for v in (self.epochs, self.steps, self.reports) if v is not None)


class PBTOptions(Strict):
    perturbation_interval: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description=(
            "Budget units (epochs, steps or reports) between exploit/explore decisions; default a quarter "
            "of the budget, or every report when the search has no budget."
        ),
    )
    burn_in_period: int = Field(
        default=0, ge=0, le=100_000_000, description="Budget units before the first perturbation."
    )
    quantile_fraction: float = Field(
        default=0.25,
        gt=0.0,
        le=0.5,
        description="Share of the population at the bottom that clones a trial from the top share of the same size.",
    )
    resample_probability: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="Chance that an explored value is drawn anew from its distribution instead of perturbed.",
    )
    perturbation_factors: tuple[float, float] = Field(
        default=(1.2, 0.8), description="A continuous value is multiplied by one of these when perturbed."
    )
    hyperparam_mutations: dict[str, Distribution] | None = Field(
        default=None,
        max_length=MAX_SEARCHED_FIELDS,
        description="Fields PBT perturbs and where it resamples them from; default the whole search space.",
    )
    align: bool = Field(
        default=True,
        description=(
            "Hold a trial at each perturbation point until every running trial has reached it (its run waits; "
            "no restart), so short trials overlap and scores are compared at the same epoch. Applies when "
            "the whole population runs at once."
        ),
    )


class ASHAOptions(Strict):
    grace_period: int = Field(
        default=1, ge=1, le=100_000_000, description="Budget units every trial gets before it may be stopped."
    )
    reduction_factor: float = Field(
        default=2.0, gt=1.0, le=1000, description="Only 1/reduction_factor of trials go on at each rung."
    )
    brackets: int = Field(default=1, ge=1, le=10, description="Number of ASHA brackets.")
