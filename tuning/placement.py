"""The placement groups of a search's trials: Tune's own manager, except that a group the
search asked for and no longer wants is removed only once Ray has placed it.

Tune drops a placement group it asked for before it is ready whenever a trial that waits
for one is handed a cached actor instead (``reuse_actors``) or a waiting trial goes away.
Ray 2.60 leaks the CPU of a bundle whose placement group is removed while the raylet
prepares it (ray-project/ray#64693): the raylet counts it as used after every actor, group
and job of the search is gone, so a later search that needs the whole cluster queues for
ever. A group removed once placed goes through Ray's path for placed groups, which returns
its bundles. An unwanted group holds its CPUs only from its placement to the controller's
next step; one still unplaced when the search ends is removed then, as Tune does.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.air.execution import PlacementGroupResourceManager
from ray.util.placement_group import remove_placement_group


class SettledRemoval(PlacementGroupResourceManager):
    """``PlacementGroupResourceManager`` whose cancelled, still unplaced groups wait
    (their ``ready()`` futures) until Ray places them, then go."""

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
    """Tune's controller builds its manager from this module-level name (the Tuner has no
    option for it); only this process's searches (the search driver's) are affected."""
    from ray.tune.execution import tune_controller

    tune_controller.PlacementGroupResourceManager = SettledRemoval
