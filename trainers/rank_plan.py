"""What every local rank of one start gets (``trainers.rank_worker``), apart from the
rank's own number and link: defined apart from the rank's code, which imports torch, so
the process that plans the ranks without running them stays light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class RankPlan:
    """What every rank of one start of the ranks gets (picklable: a forkserver start
    sends it)."""

    run_name: str
    storage_path: str
    world_size: int
    master_port: int
    loop: Callable[[dict], Any]
    loop_config: dict
    checkpoint: Any  # the run's latest ray.train.Checkpoint, or None
    cpus_per_rank: float = 1.0
    trial_id: str = ""  # a search trial's ranks: their phase marks name it
    # Rank 0 waits for the runner's word after each report (a search trial: Tune decides
    # about one report before the loop runs on), and the loop keeps at most one report uploading.
    acks: bool = False
    # Whether the ranks get torchrun's environment (local mode then makes their process
    # group); a Tune function runs without one, as in Tune's own trainable.
    torchrun: bool = True
