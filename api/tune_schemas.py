"""The contract of a hyperparameter search: ``kind: tune`` job specs and what the API
answers about their trials.

A ``TuneSpec`` is a base ``TrainSpec`` (a built-in model or user code), a search space
over dotted field paths of it (``optimizer.lr``, ``batch_size``, ``config.dropout``), an
algorithm (random, grid, asha, pbt, pb2, bayesian), the metric to optimise and a
per-trial budget. Every trial is that base spec with the sampled values put in, run as
its own distributed ``TorchTrainer``. ``TuneSpec.trial_spec`` builds a trial's spec;
the validators run it on every edge of the space at submit time, so a value that would
make a trial's spec invalid is refused before anything runs.

Like ``api.schemas`` this module imports only pydantic and the standard library.
``TrainSpec`` lives in ``api.schemas``, which imports this module to add ``TuneSpec`` to
the ``JobSpec`` union; the reference is resolved at the end of this module, so either
module may be imported first.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if TYPE_CHECKING:
    from api.schemas import TrainSpec

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
JOB_KINDS = ("train", "tune")

# Fields of the base spec a search may not vary, and why (the message says what to do).
FIXED_FIELDS = {
    "kind": "the job kind",
    "name": "a job-level field; set it on the tune job",
    "labels": "a job-level field; set it on the tune job",
    "priority": "a job-level field; set it on the tune job",
    "max_runtime_s": "a job-level field; set it on the tune job",
    "scheduling_timeout_s": "a job-level field; set it on the tune job",
    "entrypoint": "the code every trial runs",
    "working_dir": "the code every trial runs",
    "runtime_env": "the environment every trial runs in",
    "scaling": "every trial holds the same resources (the cluster budget is checked against them); set base.scaling",
    "epochs": "the trial budget; set budget.epochs",
    "max_steps": "the trial budget; set budget.steps",
    "checkpoint": "the search checkpoints every report so PBT can clone any trial",
}
# What the built-in classifiers report at every epoch (trainers/loop.py).
CLASSIFIER_METRICS = ("val_acc", "val_loss", "train_loss")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def job_kind(value: Any) -> str:
    """The discriminator of ``JobSpec``: a spec without ``kind`` is a training job."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind is not None else "train"


# ----------------------------------------------------------------------------- search space


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
    values: list[Any] = Field(min_length=1, description="The values to choose from.")


class Grid(Strict):
    type: Literal["grid"] = Field(description="Every value in turn: the search runs each one.")
    values: list[Any] = Field(min_length=1, description="The values to run.")


Distribution = Annotated[Union[Uniform, LogUniform, Choice, Grid], Field(discriminator="type")]
CONTINUOUS = (Uniform, LogUniform)


# ----------------------------------------------------------------------------- options


class TrialBudget(Strict):
    epochs: int | None = Field(default=None, ge=1, le=100_000, description="Epochs each trial trains at most.")
    steps: int | None = Field(default=None, ge=1, le=100_000_000, description="Optimizer steps each trial trains at most.")

    @model_validator(mode="after")
    def _one_unit(self) -> "TrialBudget":
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of budget.epochs or budget.steps")
        return self

    @property
    def unit(self) -> str:
        """The reported metric that counts the budget, and the schedulers' time axis."""
        return "epoch" if self.epochs is not None else "step"

    @property
    def amount(self) -> int:
        return self.epochs if self.epochs is not None else self.steps


class PBTOptions(Strict):
    perturbation_interval: int | None = Field(
        default=None, ge=1,
        description="Budget units (epochs or steps) between exploit/explore decisions; default a quarter of the budget.",
    )  # fmt: skip
    burn_in_period: int = Field(default=0, ge=0, description="Budget units before the first perturbation.")
    quantile_fraction: float = Field(
        default=0.25, gt=0.0, le=0.5,
        description="Share of the population at the bottom that clones a trial from the top share of the same size.",
    )  # fmt: skip
    resample_probability: float = Field(
        default=0.25, ge=0.0, le=1.0,
        description="Chance that an explored value is drawn anew from its distribution instead of perturbed.",
    )  # fmt: skip
    perturbation_factors: tuple[float, float] = Field(
        default=(1.2, 0.8), description="A continuous value is multiplied by one of these when perturbed."
    )
    hyperparam_mutations: dict[str, Distribution] | None = Field(
        default=None,
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
    grace_period: int = Field(default=1, ge=1, description="Budget units every trial gets before it may be stopped.")
    reduction_factor: float = Field(default=2.0, gt=1.0, description="Only 1/reduction_factor of trials go on at each rung.")
    brackets: int = Field(default=1, ge=1, le=10, description="Number of ASHA brackets.")


# ----------------------------------------------------------------------------- the tune job


class TuneSpec(Strict):
    """A hyperparameter search: a population of distributed training trials."""

    kind: Literal["tune"] = Field(description="Job kind: a hyperparameter search.")
    name: str = Field(default="search", pattern=NAME_PATTERN, description="Human-readable name (letters, digits, . _ -).")
    labels: dict[str, str] = Field(default_factory=dict, description="Free labels to filter jobs by.")
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Queue priority: higher starts first; equal priorities start in arrival order."
    )
    max_runtime_s: float | None = Field(
        default=None, gt=0, description="Fail the search (cause TIMEOUT) if it runs longer than this many seconds."
    )
    scheduling_timeout_s: float | None = Field(
        default=None, gt=0,
        description="Fail the search (cause NO_RESOURCES) if the cluster cannot start it within this many seconds of submission.",
    )  # fmt: skip

    base: TrainSpec = Field(description="The training spec every trial starts from (a built-in model or user code).")
    search_space: dict[str, Distribution] = Field(
        description=(
            "Dotted field paths of `base` (optimizer.lr, batch_size, model.dropout, config.<key> for user code) "
            "mapped to distributions: {type: uniform|loguniform, low, high} or {type: choice|grid, values}."
        )
    )
    algorithm: Literal["random", "grid", "asha", "pbt", "pb2", "bayesian"] = Field(
        default="random",
        description=(
            "random: sample the space; grid: run every grid point; asha: random with early stopping; "
            "pbt: population-based training (clone the best trials' weights, perturb their hyperparameters); "
            "pb2: PBT with a Gaussian-process explorer (continuous values only); bayesian: Optuna's TPE."
        ),
    )
    metric: str = Field(min_length=1, description="Reported metric to optimise, e.g. val_acc or val_loss.")
    mode: Literal["min", "max"] = Field(description="Whether a lower (min) or higher (max) metric is better.")
    num_trials: int | None = Field(
        default=None, ge=1, le=10_000,
        description="Trials in all (the PBT population). Default: the grid size with grid entries, else 4.",
    )  # fmt: skip
    max_concurrent_trials: int | None = Field(
        default=None, ge=1, le=10_000, description="Trials running at once; default all of them. Checked against the cluster."
    )
    budget: TrialBudget | None = Field(
        default=None,
        description=(
            "Per-trial budget in epochs or steps: the time axis of asha, pbt and pb2. Default the base's "
            "epochs or max_steps; required for user code, whose loop must report `epoch` or `step`."
        ),
    )
    driver_cpus_per_trial: float = Field(
        default=1.0, gt=0.0, le=64,
        description="CPUs held by each trial's driver (the Tune trainable that runs its TorchTrainer), on top of base.scaling.",
    )  # fmt: skip
    seed: int | None = Field(default=None, ge=0, description="Seed for sampling and PBT's choices (reproducible searches).")
    pbt: PBTOptions | None = Field(default=None, description="Options of algorithm pbt and pb2.")
    asha: ASHAOptions | None = Field(default=None, description="Options of algorithm asha.")

    # ------------------------------------------------------------------ job plumbing

    # A search runs its base's code in its base's environment: these make the job
    # service and the Ray backend treat a tune job like a training job of that code.
    @property
    def is_user_code(self) -> bool:
        return self.base.is_user_code

    @property
    def entrypoint(self) -> str | None:
        return self.base.entrypoint

    @property
    def working_dir(self) -> str | None:
        return self.base.working_dir

    @working_dir.setter
    def working_dir(self, value: str | None) -> None:
        self.base.working_dir = value

    @property
    def runtime_env(self) -> dict[str, Any] | None:
        return self.base.runtime_env

    @property
    def epochs(self) -> int | None:
        return self.budget.epochs if self.budget else None

    @property
    def max_steps(self) -> int | None:
        return self.budget.steps if self.budget else None

    # ------------------------------------------------------------------ derived

    @property
    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.search_space.values() if isinstance(d, Grid))

    @property
    def concurrency(self) -> int:
        return min(self.max_concurrent_trials or self.num_trials, self.num_trials)

    @property
    def mutations(self) -> dict[str, Any]:
        """What PBT perturbs: its own mutations, else the search space."""
        if self.pbt is not None and self.pbt.hyperparam_mutations:
            return dict(self.pbt.hyperparam_mutations)
        return dict(self.search_space)

    def trial_spec(self, values: dict[str, Any]) -> "TrainSpec":
        """The training spec of one trial: the base with ``values`` (dotted path ->
        value) put in, the budget as its length, and a checkpoint at every report."""
        return _train_spec_cls().model_validate(self._trial_dict(values))

    def _trial_dict(self, values: dict[str, Any]) -> dict[str, Any]:
        spec = apply_values(self.base.model_dump(mode="json"), values)
        if not self.base.is_user_code and self.budget is not None:
            spec["epochs"], spec["max_steps"] = self.budget.epochs, self.budget.steps
            ckpt = spec.setdefault("checkpoint", {})
            ckpt["every_n_epochs"] = 1
            if self.budget.steps is not None:
                interval = self.pbt.perturbation_interval if self.pbt and self.pbt.perturbation_interval else None
                ckpt["every_n_steps"] = ckpt.get("every_n_steps") or interval or max(1, self.budget.steps // 10)
        return spec

    # ------------------------------------------------------------------ validation

    @model_validator(mode="after")
    def _check_search(self) -> "TuneSpec":
        problems = self._defaults_and_shape()
        if not problems:
            problems += self._value_problems()
        if problems:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
        return self

    def _defaults_and_shape(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if not self.search_space:
            return [(
                "search_space",
                "the search space is empty; give at least one field to search, "
                "e.g. {optimizer.lr: {type: loguniform, low: 0.0001, high: 0.1}}",
            )]
        for path in self.search_space:
            if (why := self._path_problem(path)) is not None:
                problems.append((f"search_space.{path}", why))
        if self.pbt is not None and self.pbt.hyperparam_mutations:
            for path in self.pbt.hyperparam_mutations:
                if (why := self._path_problem(path)) is not None:
                    problems.append((f"pbt.hyperparam_mutations.{path}", why))

        if self.budget is None:
            if self.base.is_user_code:
                problems.append((
                    "budget",
                    "a search over user code needs budget.epochs or budget.steps, "
                    "and its loop must report that unit (`epoch` or `step`) with every ray.train.report",
                ))
            else:
                self.budget = TrialBudget(epochs=self.base.epochs, steps=None if self.base.epochs else self.base.max_steps)

        grid = [p for p, d in self.search_space.items() if isinstance(d, Grid)]
        if self.algorithm == "grid" and not grid:
            problems.append(("search_space", "algorithm grid needs at least one {type: grid, values: [...]} entry"))
        if self.algorithm == "bayesian" and grid:
            problems.append((f"search_space.{grid[0]}", "bayesian search samples; it cannot run a grid. Use type choice"))
        if self.num_trials is None:
            self.num_trials = self.grid_size if grid else 4
        elif grid and self.num_trials % self.grid_size:
            problems.append((
                "num_trials",
                f"the grid has {self.grid_size} points; num_trials ({self.num_trials}) must be a multiple of it "
                f"(each point runs num_trials / {self.grid_size} times), or leave it out",
            ))
        if self.max_concurrent_trials is None:
            self.max_concurrent_trials = self.num_trials

        if self.pbt is not None and self.algorithm not in ("pbt", "pb2"):
            problems.append(("pbt", f"options for algorithm pbt or pb2; algorithm is {self.algorithm}"))
        if self.asha is not None and self.algorithm != "asha":
            problems.append(("asha", f"options for algorithm asha; algorithm is {self.algorithm}"))
        if self.algorithm in ("pbt", "pb2"):
            problems += self._population_problems()
        if self.algorithm == "asha" and self.budget is not None:
            self.asha = self.asha or ASHAOptions()
            if self.asha.grace_period >= self.budget.amount:
                problems.append((
                    "asha.grace_period",
                    f"{self.asha.grace_period} leaves no room to stop a trial early in a budget of "
                    f"{self.budget.amount} {self.budget.unit}s; lower it or raise the budget",
                ))
        if not self.base.is_user_code and self.base.model is not None and self.base.model.type in ("mlp", "cnn"):
            if self.metric not in CLASSIFIER_METRICS:
                problems.append((
                    "metric",
                    f"model.type {self.base.model.type} reports {', '.join(CLASSIFIER_METRICS)}; "
                    f"it never reports {self.metric!r}",
                ))
        return problems

    def _population_problems(self) -> list[tuple[str, str]]:
        self.pbt = self.pbt or PBTOptions()
        problems: list[tuple[str, str]] = []
        q, n = self.pbt.quantile_fraction, self.num_trials
        if n < 2 or n * q < 1:
            need = max(2, math.ceil(1 / q - 1e-9))
            fix = f"Raise num_trials to at least {need}"
            if n >= 2:
                fix += f" or pbt.quantile_fraction to at least {math.ceil(100 / n) / 100:g}"
            problems.append((
                "num_trials",
                f"a population of {n} is too small for PBT: quantile_fraction {q:g} of it is {n * q:g} trials, "
                f"and the bottom quantile must hold at least one trial to clone one of the top. {fix}",
            ))
        if self.budget is not None:
            if self.pbt.perturbation_interval is None:
                self.pbt.perturbation_interval = max(1, self.budget.amount // 4)
            if self.pbt.perturbation_interval >= self.budget.amount:
                problems.append((
                    "pbt.perturbation_interval",
                    f"{self.pbt.perturbation_interval} is not below the trial budget of {self.budget.amount} "
                    f"{self.budget.unit}s, so no trial would ever be perturbed; lower it or raise the budget",
                ))
        if self.algorithm == "pb2":
            for path, dist in self.mutations.items():
                if not isinstance(dist, CONTINUOUS):
                    problems.append((
                        f"search_space.{path}",
                        f"pb2 explores continuous values only and this is a {dist.type}; "
                        "use algorithm pbt, or fix the value in base",
                    ))
        return problems

    def _path_problem(self, path: str) -> str | None:
        """Why ``path`` cannot be searched, or None when it can."""
        parts = path.split(".")
        if not all(parts):
            return "not a dotted field path (e.g. optimizer.lr)"
        root = parts[0]
        if root in FIXED_FIELDS:
            return f"cannot be searched: {FIXED_FIELDS[root]}"
        if root == "config":
            if not self.base.is_user_code:
                return "config is passed to user code only; a built-in model reads its own fields (e.g. model.dropout)"
            return None if len(parts) > 1 else "name a key inside config, e.g. config.dropout"
        if root == "parallelism" and self.base.is_user_code:
            return None
        node: Any = self.base.model_dump(mode="json")
        walked: list[str] = []
        for part in parts:
            if not isinstance(node, dict):
                return f"{'.'.join(walked)} is a value, not a section, in the base spec"
            if part not in node:
                where = f"{'.'.join(walked)} has" if walked else "the base spec has"
                if node is None or not node:
                    return f"not a field of the base spec ({'.'.join(walked) or 'it'} is not set)"
                return f"not a field of the base spec; {where}: {', '.join(sorted(node))}"
            node, walked = node[part], [*walked, part]
        if isinstance(node, dict):
            return f"{path} is a section; search one of its fields: {', '.join(sorted(node))}"
        return None

    def _value_problems(self) -> list[tuple[str, str]]:
        """Every edge value of every distribution must give a valid trial spec."""
        problems: list[tuple[str, str]] = []
        spaces = {**self.search_space, **self.mutations}
        for path, dist in spaces.items():
            edges = [dist.low, dist.high] if isinstance(dist, CONTINUOUS) else list(dist.values)
            for value in edges:
                try:
                    self.trial_spec({path: value})
                except ValidationError as exc:
                    first = exc.errors()[0]
                    msg = first["msg"].removeprefix("Value error, ")
                    problems.append((f"search_space.{path}", f"value {value!r} gives an invalid trial spec: {msg}"))
                    break
        return problems


# ----------------------------------------------------------------------------- values


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


# ----------------------------------------------------------------------------- responses


class TrialPublic(BaseModel):
    trial_id: str = Field(description="Tune's id of the trial.")
    status: str = Field(description="PENDING, RUNNING, PAUSED, TERMINATED or ERROR (CANCELLED once the job was).")
    config: dict[str, Any] = Field(description="The trial's current values of the searched fields (dotted paths).")
    reports: int = Field(description="Reports received from the trial.")
    last_metrics: dict[str, Any] | None = Field(default=None, description="The trial's latest report.")
    best_metric: float | None = Field(default=None, description="The trial's best value of the search metric so far.")
    stopped_early: bool = Field(default=False, description="Ended before its budget (stopped by the scheduler).")
    exploits: int = Field(default=0, description="How many times the trial cloned another one (PBT).")
    error: str | None = Field(default=None, description="Why the trial failed, when it did.")


class TrialMetricPoint(BaseModel):
    seq: int = Field(description="Position in the search's report sequence (across trials).")
    ts: float = Field(description="Unix time the report reached the search driver.")
    epoch: int | None = None
    step: int | None = None
    metrics: dict[str, Any]
    config: dict[str, Any] = Field(description="The trial's searched values when it made the report.")


class ExploitPublic(BaseModel):
    seq: int = Field(description="Order of the event within the search.")
    ts: float = Field(description="Unix time of the decision.")
    trial_id: str = Field(description="The trial that cloned (the bottom of the population).")
    donor_trial_id: str = Field(description="The trial it cloned weights and hyperparameters from.")
    donor_time: float | None = Field(default=None, description="The donor's epoch or step at its cloned checkpoint.")
    trial_time: float | None = Field(default=None, description="The cloning trial's own epoch or step when it gave up its run.")
    donor_metric: float | None = Field(default=None, description="The donor's search metric at that checkpoint.")
    old_config: dict[str, Any] = Field(description="The cloning trial's values before.")
    donor_config: dict[str, Any] = Field(description="The donor's values.")
    new_config: dict[str, Any] = Field(description="The perturbed values the trial goes on with.")
    checkpoint_path: str | None = Field(default=None, description="The donor checkpoint the trial restarted from.")


class TrialCheckpoint(BaseModel):
    id: int | None = Field(default=None, description="Id in the job's checkpoint list (GET /v1/jobs/{id}/checkpoints/{cid}/download).")
    path: str = Field(description="Where the checkpoint lives in storage.")
    epoch: int | None = None
    step: int | None = None


class BestTrialPublic(BaseModel):
    trial_id: str = Field(description="The best trial.")
    metric: str
    mode: str
    value: float = Field(description="Its best value of the metric.")
    config: dict[str, Any] = Field(description="The searched values it had when it reported that value.")
    metrics: dict[str, Any] = Field(description="That whole report.")
    final: bool = Field(description="True once the search ended; before, the best so far.")
    checkpoint: TrialCheckpoint | None = Field(default=None, description="Its best checkpoint, once final.")


# ----------------------------------------------------------------------------- resolution

# api.schemas imports this module after defining TrainSpec (to build the JobSpec
# union), so the import below finds it whichever of the two modules came first.
from api.schemas import TrainSpec  # noqa: E402

TuneSpec.model_rebuild()


def _train_spec_cls() -> type["TrainSpec"]:
    return TrainSpec
