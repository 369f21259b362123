"""The contract of a hyperparameter search: ``kind: tune`` job specs and what the API
answers about their trials.

A ``TuneSpec`` is a base ``TrainSpec`` (a built-in model or user code), a search space
over dotted field paths of it (``optimizer.lr``, ``batch_size``, ``config.dropout``), an
algorithm (random, grid, asha, pbt, pb2, bayesian), the metric to optimise and a
per-trial budget. Every trial is that base spec with the sampled values put in, run as
its own distributed ``TorchTrainer``. ``TuneSpec.trial_spec`` builds a trial's spec;
the validators run it on every edge of the space at submit time, so a value that would
make a trial's spec invalid is refused before anything runs.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from api.schemas.job_common import JobCommon, JobName
from api.schemas.search_options import MAX_SEARCHED_FIELDS, REPORTS_UNIT, ASHAOptions, PBTOptions, TrialBudget
from api.schemas.search_space import CONTINUOUS, Distribution, Grid, apply_values
from api.schemas.train import TrainSpec

MAX_TRIALS = 10_000

# Fields of the base spec a search may not vary, and why (the message says what to do).
FIXED_FIELDS = {
    "kind": "the job kind",
    "name": "a job-level field; set it on the tune job",
    "labels": "a job-level field; set it on the tune job",
    "tracking": "a job-level field; set it on the tune job (each trial is logged under the job's run)",
    "priority": "a job-level field; set it on the tune job",
    "project": "a job-level field; set it on the tune job",
    "max_runtime_s": "a job-level field; set it on the tune job",
    "scheduling_timeout_s": "a job-level field; set it on the tune job",
    "notify": "a job-level field; set it on the tune job",
    "entrypoint": "the code every trial runs",
    "working_dir": "the code every trial runs",
    "code": "the code every trial runs",
    "runtime_env": "the environment every trial runs in",
    "scaling": "every trial holds the same resources (the cluster budget is checked against them); set base.scaling",
    "epochs": "the trial budget; set budget.epochs",
    "max_steps": "the trial budget; set budget.steps",
    "checkpoint": "the search checkpoints every report so PBT can clone any trial",
    "report": "a trial reports exactly when it checkpoints, so every report can be cloned",
    "schedule": "a search sets the optimizer values itself; search optimizer.lr (or momentum, weight_decay) instead",
}
BASE_SCHEDULE_PROBLEM = (
    "a search sets the optimizer values of its trials itself (the search space, PBT's perturbations), so a fixed "
    "schedule would fight them; remove base.schedule and search optimizer.lr (or momentum, weight_decay). "
    "A finished PBT search's best trial comes back as a schedule from GET /v1/jobs/{id}/best/replay"
)
# What the built-in classifiers report at every epoch (trainers/skeleton.py).
CLASSIFIER_METRICS = ("val_acc", "val_loss", "train_loss")


# ----------------------------------------------------------------------------- the tune job


class TuneSpec(JobCommon):
    """A hyperparameter search: a population of distributed training trials."""

    kind: Literal["tune"] = Field(description="Job kind: a hyperparameter search.")
    name: JobName = "search"

    base: TrainSpec = Field(description="The training spec every trial starts from (a built-in model or user code).")
    search_space: dict[str, Distribution] = Field(
        max_length=MAX_SEARCHED_FIELDS,
        description=(
            "Dotted field paths of `base` (optimizer.lr, batch_size, model.dropout, config.<key> for user code) "
            "mapped to distributions: {type: uniform|loguniform, low, high} or {type: choice|grid, values}."
        ),
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
        default=None,
        ge=1,
        le=MAX_TRIALS,
        description="Trials in all (the PBT population). Default: the grid size with grid entries, else 4.",
    )
    max_concurrent_trials: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TRIALS,
        description="Trials running at once; default all of them. Checked against the cluster.",
    )
    budget: TrialBudget | None = Field(
        default=None,
        description=(
            "Per-trial budget in epochs, steps or reports: the time axis of asha, pbt and pb2. Default the "
            "base's epochs or max_steps; for user code none (the loop's own end), counted in reports "
            "(Tune's training_iteration) unless the budget names epochs or steps, which the loop must then report."
        ),
    )
    trainable: Literal["train", "function"] = Field(
        default="train",
        description=(
            "How a trial runs base.entrypoint: train, as a Ray Train loop (a TorchTrainer of base.scaling.num_workers "
            "workers per trial); function, as a Ray Tune function trainable (one process per trial that calls "
            "tune.report and tune.get_checkpoint, holding base.scaling's per-worker resources; no driver on top)."
        ),
    )
    first_report_timeout_s: float = Field(
        default=1800,
        ge=1,
        le=7 * 86_400,
        description=(
            "How long a trial may run before its first report: past it the trial is stopped and fails saying so "
            "(a loop or function that never reports is never a silent hang). Counted from each start of the trial."
        ),
    )
    stall_timeout_s: float | None = Field(
        default=None,
        ge=1,
        le=7 * 86_400,
        description=(
            "How long the search may go with no trial running while one could start (every trial left PAUSED or "
            "PENDING with room on the cluster for one): past it the search fails, naming its trials and their "
            "states. Default the server's RAYDOCK_SEARCH_STALL_S (120 s)."
        ),
    )
    driver_cpus_per_trial: float = Field(
        default=1.0,
        gt=0.0,
        le=64,
        description="CPUs held by each trial's driver (the Tune trainable that runs its TorchTrainer), on top of base.scaling.",
    )
    seed: int | None = Field(
        default=None, ge=0, lt=2**32, description="Seed for sampling and PBT's choices (reproducible searches)."
    )
    pbt: PBTOptions | None = Field(default=None, description="Options of algorithm pbt and pb2.")
    asha: ASHAOptions | None = Field(default=None, description="Options of algorithm asha.")

    # ------------------------------------------------------------------ the budget

    @property
    def unit(self) -> str:
        """The schedulers' time axis: the budget's unit, else Tune's count of reports."""
        return self.budget.unit if self.budget else REPORTS_UNIT

    @property
    def budget_amount(self) -> int | None:
        """The per-trial budget in ``unit``; None when the loop's own end is the budget."""
        return self.budget.amount if self.budget else None

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
        return TrainSpec.model_validate(self._trial_dict(values))

    def _trial_dict(self, values: dict[str, Any]) -> dict[str, Any]:
        spec = apply_values(self.base.model_dump(mode="json"), values)
        if not self.base.is_user_code and self.budget is not None:
            spec["epochs"], spec["max_steps"] = self.budget.epochs, self.budget.steps
            ckpt = spec.setdefault("checkpoint", {})
            ckpt["every_n_epochs"] = 1
            if self.budget.steps is not None:
                interval = self.pbt.perturbation_interval if self.pbt and self.pbt.perturbation_interval else None
                ckpt["every_n_steps"] = ckpt.get("every_n_steps") or interval or max(1, self.budget.steps // 10)
            # No reports between checkpoints: a PBT decision taken on a report without a
            # checkpoint has nothing to clone ("Skip exploit").
            spec["report"] = {"every_s": 86_400.0, "every_n_steps": None}
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
        if self.base.schedule is not None:
            problems.append(("base.schedule", BASE_SCHEDULE_PROBLEM))
        if self.base.tracking is not None:
            problems.append(("base.tracking", FIXED_FIELDS["tracking"]))
        if self.base.project is not None:  # a trial cannot run in another project than its search
            problems.append(("base.project", FIXED_FIELDS["project"]))
        if self.base.after or self.base.init_from is not None:  # the search waits and starts, not a trial
            problems.append(("base.after", "a search's dependencies go on the search itself (after), not its base"))
        if self.init_from is not None:
            problems.append(("init_from", "a search cannot start from a checkpoint; give init_from to a training job"))
        if not self.search_space:
            return problems + [
                (
                    "search_space",
                    "the search space is empty; give at least one field to search, "
                    "e.g. {optimizer.lr: {type: loguniform, low: 0.0001, high: 0.1}}",
                )
            ]
        for path in self.search_space:
            if (why := self._path_problem(path)) is not None:
                problems.append((f"search_space.{path}", why))
        if self.pbt is not None and self.pbt.hyperparam_mutations:
            for path in self.pbt.hyperparam_mutations:
                if (why := self._path_problem(path)) is not None:
                    problems.append((f"pbt.hyperparam_mutations.{path}", why))

        if self.trainable == "function":
            problems += self._function_problems()
        if self.budget is None and not self.base.is_user_code:
            self.budget = TrialBudget(epochs=self.base.epochs, steps=None if self.base.epochs else self.base.max_steps)

        grid = [p for p, d in self.search_space.items() if isinstance(d, Grid)]
        if self.algorithm == "grid" and not grid:
            problems.append(("search_space", "algorithm grid needs at least one {type: grid, values: [...]} entry"))
        if self.algorithm == "bayesian" and grid:
            problems.append(
                (f"search_space.{grid[0]}", "bayesian search samples; it cannot run a grid. Use type choice")
            )
        if grid and self.grid_size > MAX_TRIALS:
            return problems + [
                (
                    "search_space",
                    f"the grid has {self.grid_size} points, more than the {MAX_TRIALS} trials a search may run; "
                    "use fewer grid values or type choice",
                )
            ]
        if self.num_trials is None:
            self.num_trials = self.grid_size if grid else 4
        elif grid and self.num_trials % self.grid_size:
            problems.append(
                (
                    "num_trials",
                    f"the grid has {self.grid_size} points; num_trials ({self.num_trials}) must be a multiple of it "
                    f"(each point runs num_trials / {self.grid_size} times), or leave it out",
                )
            )
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
                problems.append(
                    (
                        "asha.grace_period",
                        f"{self.asha.grace_period} leaves no room to stop a trial early in a budget of "
                        f"{self.budget.amount} {self.budget.unit}s; lower it or raise the budget",
                    )
                )
        if not self.base.is_user_code and self.base.model is not None and self.base.model.type in ("mlp", "cnn"):
            if self.metric not in CLASSIFIER_METRICS:
                problems.append(
                    (
                        "metric",
                        f"model.type {self.base.model.type} reports {', '.join(CLASSIFIER_METRICS)}; "
                        f"it never reports {self.metric!r}",
                    )
                )
        return problems

    @property
    def trial_workers(self) -> int:
        """Processes each trial holds base.scaling's per-worker resources for."""
        return 1 if self.trainable == "function" else self.base.scaling.max_workers

    def _function_problems(self) -> list[tuple[str, str]]:
        """A function trainable is one process of the user's: no built-in model, no workers to spread over."""
        if not self.base.is_user_code:
            return [("trainable", "a function trainable is user code: give base.entrypoint (module:function)")]
        # base.scaling.num_workers and driver_cpus_per_trial do not apply (one process per trial,
        # no driver); a stored spec carries their defaults, so they are ignored rather than refused.
        problems = []
        if self.base.scaling.is_elastic:
            problems.append(("base.scaling.num_workers", "a function trainable runs each trial as one process"))
        if not self.base.default_parallelism:
            problems.append(("base.parallelism", "a function trainable runs no Ray Train workers to parallelise"))
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
            problems.append(
                (
                    "num_trials",
                    f"a population of {n} is too small for PBT: quantile_fraction {q:g} of it is {n * q:g} trials, "
                    f"and the bottom quantile must hold at least one trial to clone one of the top. {fix}",
                )
            )
        if self.pbt.perturbation_interval is None:
            # Without a budget the loop's length is unknown: compare the population at every report.
            self.pbt.perturbation_interval = max(1, self.budget.amount // 4) if self.budget else 1
        if self.budget is not None:
            if self.pbt.perturbation_interval >= self.budget.amount:
                problems.append(
                    (
                        "pbt.perturbation_interval",
                        f"{self.pbt.perturbation_interval} is not below the trial budget of {self.budget.amount} "
                        f"{self.budget.unit}s, so no trial would ever be perturbed; lower it or raise the budget",
                    )
                )
        if self.algorithm == "pb2":
            for path, dist in self.mutations.items():
                if not isinstance(dist, CONTINUOUS):
                    problems.append(
                        (
                            f"search_space.{path}",
                            f"pb2 explores continuous values only and this is a {dist.type}; "
                            "use algorithm pbt, or fix the value in base",
                        )
                    )
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
