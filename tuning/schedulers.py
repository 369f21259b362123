"""PBT and PB2 schedulers that record each exploit: which trial cloned which donor, at
which epoch or step, from which checkpoint, with which new values. Tune logs these
decisions as text only; the search's lineage in the API comes from here."""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from ray.tune.schedulers.pb2 import PB2

from api import object_store
from tuning.search_events import SearchEvents


class _RecordsExploits:
    """Mixin over PopulationBasedTraining: emits an ``exploit`` event per clone."""

    def __init__(self, *args: Any, out: SearchEvents, room_for_all: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = out
        self._room_for_all = room_for_all

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
