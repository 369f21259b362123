"""The seam between raydock and Ray Tune's controller's private books (Ray 2.60): what a
search's driver changes in how Tune's controller keeps actors and placement groups, and a
decision it holds for a trial, and the trainable a saved search started with. Tune has no
public option for any of them; when a Ray
upgrade moves these names, this module is the one place to change
(``tests/test_search_placement.py`` and ``tests/test_tune_functions.py`` fail then).
Only the search's driver installs them, so no other process's Tune is touched.
"""

from __future__ import annotations

import weakref
from typing import Any

import ray
from ray.air.execution import PlacementGroupResourceManager
from ray.tune.execution.tune_controller import TuneController
from ray.util.placement_group import remove_placement_group


def drop_cached_decision(tune_controller: Any, trial_id: str) -> None:
    """Forget what Tune's controller meant to do with the trial once its save in flight
    is in (``TuneController._cached_trial_decisions``), past the wrapper Tune hands its
    schedulers. ``tuning.schedulers`` says when that decision is stale."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    pending = getattr(controller, "_cached_trial_decisions", None)
    if isinstance(pending, dict):
        pending.pop(trial_id, None)


def started_trainable(experiment_path: str) -> str | None:
    """The name of the trainable a saved search started with (``__trainable_name`` in the
    ``tuner.pkl`` Tune writes as a ``Tuner`` is made): ``Tuner.restore`` refuses any
    trainable of another name. None when the experiment has none to read. Read only by
    the search's own driver, from its own storage, as Tune's restore reads it next."""
    import pickle
    from pathlib import PurePosixPath

    from ray.train._internal.storage import get_fs_and_path

    try:
        fs, fs_path = get_fs_and_path(experiment_path, None)
        with fs.open_input_file(str(PurePosixPath(fs_path, "tuner.pkl"))) as f:
            state = pickle.loads(f.readall())
    except Exception:  # noqa: BLE001 - no readable state: Tune's restore says what is wrong
        return None
    name = state.get("__trainable_name") if isinstance(state, dict) else None
    return name if isinstance(name, str) else None


# ----------------------------------------------------------------------------- placement groups
# Tune drops a placement group it asked for before it is ready whenever a trial that waits
# for one is handed a cached actor instead (``reuse_actors``) or a waiting trial goes away.
# Ray 2.60 leaks the CPU of a bundle whose placement group is removed while the raylet
# prepares it (ray-project/ray#64693): the raylet counts it as used after every actor, group
# and job of the search is gone, so a later search that needs the whole cluster queues for
# ever. A group removed once placed goes through Ray's path for placed groups, which returns
# its bundles. An unwanted group holds its CPUs only from its placement to the controller's
# next step; one still unplaced when the search ends is removed then, as Tune does.


class SettledRemoval(PlacementGroupResourceManager):
    """Tune's placement-group manager, except that a group it asked for and no longer wants
    waits, unplaced (its ``ready()`` future), until Ray places it, then goes. It works on
    the manager's own books (``_request_to_staged_pgs``, ``_pg_to_staging_future``,
    ``_staging_future_to_pg``, ``_pg_to_request``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unwanted: dict[ray.ObjectRef, Any] = {}  # ready() future -> placement group

    def cancel_resource_request(self, resource_request: Any) -> None:
        staged = self._request_to_staged_pgs[resource_request]
        if not staged:  # a placed group: Tune's own removal returns its bundles
            super().cancel_resource_request(resource_request)
            return
        pg = staged.pop()
        future = self._pg_to_staging_future.pop(pg)
        self._staging_future_to_pg.pop(future)
        self._pg_to_request.pop(pg)
        self._unwanted[future] = pg

    def update_state(self) -> None:
        super().update_state()
        if self._unwanted:
            placed, _ = ray.wait(list(self._unwanted), num_returns=len(self._unwanted), timeout=0)
            for future in placed:
                remove_placement_group(self._unwanted.pop(future))

    def clear(self) -> None:
        if ray.is_initialized():
            for future, pg in self._unwanted.items():
                remove_placement_group(pg)
                ray.cancel(future)  # as Tune's own cancel: an unplaced group's ready() would wait for ever
        self._unwanted = {}
        super().clear()


def install_settled_removal() -> None:
    """Make Tune's controllers in this process build ``SettledRemoval`` as their manager:
    they build it from a module-level name (the Tuner has no option for it), so only this
    process's searches (the search driver's) are affected."""
    from ray.tune.execution import tune_controller

    tune_controller.PlacementGroupResourceManager = SettledRemoval


# ----------------------------------------------------------------------------- kept actors
# A paused trial keeps its trainable's process for its restart (``reuse_actors``), when the
# search's scheduler asks for it (``keeps_paused_actors``: PBT over function trainables
# whose whole population runs at once). Tune caches a stopped or paused trial's actor only
# for a trial waiting to be placed with the same resources, or one actor when nothing else
# is cached (none once its searcher has made every trial). Synchronous PBT pauses the whole
# population at each perturbation point with none waiting, so all restarts but one (each
# clone's and each kept trial's) started a new process: 21 to 27 for an 8-trial search, the
# better part of a second between an exploit decision and the clone's next report. Here a
# pause keeps the actor in Tune's cache and reserves a place there for it; the trial's
# restart (any restart of those resources) takes it back through Tune's own path
# (``reset``, restore from the checkpoint, ``train``), and the reservation goes with it. A
# trial whose own process is being started does not take a kept one (Tune would hand it
# over and stop the one starting, and the paused trial's restart would start another). A
# reservation whose trial ended paused is dropped at the controller's next step, and Tune's
# own clean-up stops every cached actor when the search ends or is stopped.

# Per controller, outside it (Tune writes its controller's attributes into the experiment's
# saved state): each kept actor -> its resources (a place reserved), and the trial being paused.
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PAUSING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _keeps(controller: Any) -> bool:
    return bool(controller._reuse_actors and getattr(controller._scheduler_alg, "keeps_paused_actors", False))


def _kept(controller: Any) -> dict[Any, Any]:
    return _KEPT.setdefault(controller, {})


def places_kept() -> int:
    """Processes kept in this process' searches for paused trials' restarts: a paused
    trial can start in one whatever the cluster has free (``tuning.stall``)."""
    return sum(len(kept) for kept in list(_KEPT.values()))


def _cache_for_restart(controller: Any, trial: Any) -> bool:
    """Tune's ``_maybe_cache_trial_actor`` for a trial being paused: its actor is cached
    whatever else waits, with a place reserved for it."""
    tracked = controller._trial_to_actor[trial]
    actors = controller._actor_manager
    if (
        not actors.is_actor_started(tracked)
        or actors.is_actor_failed(tracked)
        or tracked not in controller._started_actors
    ):
        return False  # as Tune's: an actor not up yet is not kept
    resources = trial.placement_group_factory
    controller._actor_cache.increase_max(resources)
    if not controller._actor_cache.cache_object(resources, tracked):
        controller._actor_cache.decrease_max(resources)
        return False
    _kept(controller)[tracked] = resources
    controller._trial_to_actor.pop(trial)
    controller._actor_to_trial.pop(tracked)
    trial.set_ray_actor(None)
    return True


def _release(controller: Any, tracked: Any) -> None:
    resources = _kept(controller).pop(tracked, None)
    if resources is not None:
        controller._actor_cache.decrease_max(resources)


def install_kept_actors() -> None:
    """Patch Tune's controller class in this process (the search's driver); a controller
    whose scheduler does not ask for it behaves as Tune's own."""
    if getattr(TuneController, "_raydock_kept_actors", False):
        return
    pause, cache, reuse, step_end = (
        TuneController._schedule_trial_pause,
        TuneController._maybe_cache_trial_actor,
        TuneController._maybe_reuse_cached_actor,
        TuneController.on_step_end,
    )

    def _schedule_trial_pause(self, trial, should_checkpoint: bool = True):
        if should_checkpoint or not _keeps(self):
            return pause(self, trial, should_checkpoint)
        _PAUSING[self] = trial  # the pause stops the actor now: keep it
        try:
            return pause(self, trial, should_checkpoint)
        finally:
            _PAUSING.pop(self, None)

    def _maybe_cache_trial_actor(self, trial) -> bool:
        if _PAUSING.get(self) is trial:
            return _cache_for_restart(self, trial)
        return cache(self, trial)

    def _maybe_reuse_cached_actor(self, trial) -> bool:
        cached = self._actor_cache._cached_objects.get(trial.placement_group_factory)
        taken = cached[0] if cached and trial not in self._resetting_trials else None  # Tune takes the first
        if taken in _kept(self) and trial in self._trial_to_actor:
            return False  # a trial whose own process is on its way leaves a paused trial's to it
        reused = reuse(self, trial)
        if reused and taken is not None:
            _release(self, taken)  # a kept actor taken back: its place goes with it
        return reused

    def on_step_end(self) -> None:
        # A place reserved for a trial no longer paused without an actor (it ended paused,
        # or another trial took the actor) is dropped; Tune's clean-up then stops the actor.
        kept = _kept(self)
        for resources in set(kept.values()):
            actors = [a for a, r in kept.items() if r == resources]
            waiting = sum(
                1
                for t in self._paused_trials
                if t.placement_group_factory == resources and t not in self._trial_to_actor
            )
            for actor in actors[: max(len(actors) - waiting, 0)]:
                _release(self, actor)
        step_end(self)

    TuneController._schedule_trial_pause = _schedule_trial_pause
    TuneController._maybe_cache_trial_actor = _maybe_cache_trial_actor
    TuneController._maybe_reuse_cached_actor = _maybe_reuse_cached_actor
    TuneController.on_step_end = on_step_end
    TuneController._raydock_kept_actors = True
