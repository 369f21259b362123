"""PBT and PB2 schedulers that record each exploit: which trial cloned which donor, at
which epoch or step, from which checkpoint, with which new values. Tune logs these
decisions as text only; the search's lineage in the API comes from here."""

from __future__ import annotations

import math
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from ray.tune.schedulers.pb2 import PB2

from api import object_store
from trainers.tune_compat import drop_cached_decision
from tuning.search_events import SearchEvents


class _KeepsSynchMoving:
    """Mixin over PopulationBasedTraining: Tune's synchronous mode never leaves the
    population waiting at a perturbation point for ever (the noisy quadratic's stalled
    search, ``bench.pbt_warm``)."""

    def _exploit(self, tune_controller, trial, trial_to_clone) -> None:
        """Tune's synchronous PBT can clone into a trial that reached the perturbation point
        one report before the population and is still saving on its way to a pause: it stops
        the trial's actor, and the stop, seeing the save in flight, leaves a STOP to run once
        that save is in. That save never comes back (its actor is gone); the trial's next one
        does, after its restart from the donor, and the STOP ends the clone one report later
        (TERMINATED short of its budget), so the rest of the population waits for it at the
        next perturbation point for ever. A trial paused here has no decision pending."""
        super()._exploit(tune_controller, trial, trial_to_clone)
        if trial.status == Trial.PAUSED:
            drop_cached_decision(tune_controller, trial.trial_id)

    # Synchronous PBT perturbs when the last trial of the population reports at the
    # perturbation point; Tune never looks again when a trial ends instead (its function
    # returned, it failed, it was stopped), so the others would wait there for ever.
    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        super().on_trial_complete(tune_controller, trial, result)
        self._release_waiting(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        super().on_trial_error(tune_controller, trial)
        self._release_waiting(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial) -> None:
        super().on_trial_remove(tune_controller, trial)
        self._release_waiting(tune_controller, trial)

    def _release_waiting(self, tune_controller, ended) -> None:
        """When every trial left waits at the synchronous perturbation point, perturb them
        there as the last report would have, and move the point on."""
        if not self._synch:
            return
        waiting = [t for t in tune_controller.get_live_trials() if t is not ended and not t.is_finished()]
        states = [self._trial_state[t] for t in waiting if t in self._trial_state]
        if not states or any(s.last_train_time < self._next_perturbation_sync for s in states):
            return  # nobody left, or someone still on its way (its report perturbs)
        time = max(s.last_train_time for s in states)
        lower, upper = self._quantiles_of(waiting)
        middle = [t for t in waiting if t not in lower and t not in upper]
        for t in [*upper, *middle, *lower]:  # the strong save before the weak clone them
            self._trial_state[t].last_perturbation_time = time
            self._checkpoint_or_exploit(t, tune_controller, upper, lower)
        self._next_perturbation_sync = max(
            self._next_perturbation_sync + self._perturbation_interval,
            max(self._trial_state[t].last_train_time for t in tune_controller.get_trials() if t in self._trial_state),
        )

    def _quantiles_of(self, trials: list) -> tuple[list, list]:
        """PBT's bottom and top quantiles (``_quantiles``) among ``trials`` only."""
        scored = [t for t in trials if (s := self._trial_state[t].last_score) is not None and not math.isnan(s)]
        scored.sort(key=lambda t: self._trial_state[t].last_score)
        n = min(int(math.ceil(len(scored) * self._quantile_fraction)), len(scored) // 2)
        return (scored[:n], scored[len(scored) - n :]) if n else ([], [])


class _RecordsExploits(_KeepsSynchMoving):
    """Mixin over PopulationBasedTraining: emits an ``exploit`` event per clone."""

    def __init__(
        self, *args: Any, out: SearchEvents, room_for_all: bool, keeps_paused_actors: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._out = out
        self._room_for_all = room_for_all
        # A paused trial keeps its process for its restart (trainers.tune_compat reads this).
        self.keeps_paused_actors = keeps_paused_actors
        self._clones: list = []  # exploited trials not restarted yet, in decision order

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        """Tune's choice (the trial furthest behind), except that in synchronous PBT a
        clone restarts before the trials that only wait at the perturbation point: its
        next report is the one the population waits for, and Tune restarts one trial per
        step of its loop."""
        chosen = super().choose_trial_to_run(tune_controller)
        self._clones = [t for t in self._clones if t.status in (Trial.PENDING, Trial.PAUSED)]
        if not self._synch or chosen is None or chosen in self._clones:
            return chosen  # asynchronous PBT: Tune's fair share, the trial furthest behind
        ready = [t for t in self._clones if self._trial_state[t].last_train_time < self._next_perturbation_sync]
        return ready[0] if ready else chosen

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        state = self._trial_state.get(trial)
        perturbed_at = state.last_perturbation_time if state is not None else None
        decision = super().on_trial_result(tune_controller, trial, result)
        if state is not None and state.last_perturbation_time == perturbed_at and trial.checkpoint is not None:
            # Between its own perturbation points a trial can still be another's donor:
            # the first trial to reach a point meets the others one report short of it.
            state.last_checkpoint = trial.checkpoint
        if decision == TrialScheduler.PAUSE and trial.status != Trial.PAUSED and self._room_for_all and not self._synch:
            # PBT pauses a trial at its perturbation point while others wait, to share
            # the cluster. When the whole population runs at once, the waiting ones are
            # only restarting from a clone, and a pause would cost this one a restart.
            return TrialScheduler.CONTINUE
        return decision

    def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile: list, lower_quantile: list) -> None:
        # PBT keeps a checkpoint only of trials in the top quantile when they reach a
        # perturbation point; the first trial to reach one is alone there, so it could
        # never be cloned from in that round. Every report here carries a checkpoint:
        # keep each trial's, and let only the bottom exploit.
        if trial not in lower_quantile and trial not in upper_quantile:
            upper_quantile = [*upper_quantile, trial]
        super()._checkpoint_or_exploit(trial, tune_controller, upper_quantile, lower_quantile)

    def _exploit(self, tune_controller, trial, trial_to_clone) -> None:
        old_config = dict(trial.config)
        # PBT copies the donor's clock onto the trial; read the trial's own first.
        trial_time = self._trial_state[trial].last_train_time
        super()._exploit(tune_controller, trial, trial_to_clone)
        self._clones.append(trial)
        donor = self._trial_state[trial_to_clone]
        result = donor.last_result or {}
        checkpoint = donor.last_checkpoint
        self._out.exploit(
            trial_id=trial.trial_id,
            donor_trial_id=trial_to_clone.trial_id,
            donor_time=result.get(self._time_attr),
            trial_time=trial_time,
            donor_metric=result.get(self._metric),
            old_config=old_config,
            donor_config=dict(trial_to_clone.config),
            new_config=dict(trial.config),
            checkpoint_path=_uri(checkpoint),
        )


def _uri(checkpoint: Any) -> str | None:
    """The donor's checkpoint as a URI (on an object store Ray names it by bucket/key)."""
    path = getattr(checkpoint, "path", None)
    return object_store.uri_of(getattr(checkpoint, "filesystem", None), path) if path else None


class RecordingPBT(_RecordsExploits, PopulationBasedTraining):
    pass


class RecordingPB2(_RecordsExploits, PB2):
    pass


class SynchSafePBT(_KeepsSynchMoving, PopulationBasedTraining):
    """Tune's PBT with only the synchronous mode's two fixes (``bench.pbt_by_hand``)."""
