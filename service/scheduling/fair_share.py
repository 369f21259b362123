"""Fair share, as pure functions over plain values: a project's quota and load, the
order projects' jobs are admitted in, whether a job waits for its project's quota, how
recent usage decays, and which borrowed jobs to preempt for a project under its guarantee.

The admission order (``order_key``): jobs that keep their project within its guarantee
first; then the project with the least decayed recent usage (GPU-seconds, then
CPU-seconds: GPUs are the scarce part); then priority (higher first); then arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

EPS = 1e-9
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)


def decay(value: float, as_of: datetime, now: datetime, half_life_s: float) -> float:
    """``value`` measured at ``as_of``, decayed to ``now``: value * 2 ** (-(now - as_of) / half_life)."""
    elapsed = max((now - as_of).total_seconds(), 0.0)
    return value * 2.0 ** (-elapsed / half_life_s)


@dataclass(frozen=True)
class Quota:
    """A project's quota; None: no limit. Guarantees default to 0."""

    guaranteed_cpus: float = 0.0
    guaranteed_gpus: float = 0.0
    max_cpus: float | None = None
    max_gpus: float | None = None
    max_running: int | None = None
    max_queued: int | None = None


@dataclass
class ProjectLoad:
    """What a project's started jobs hold now, its quota and its decayed recent usage.
    Admission updates it as it starts jobs within one pass."""

    name: str
    quota: Quota = Quota()
    cpus: float = 0.0
    gpus: float = 0.0
    running: int = 0
    cpu_seconds: float = 0.0  # decayed to now
    gpu_seconds: float = 0.0
    blocked: bool = False  # its next job waits for its quota: the rest of its jobs wait too

    def within_guarantee(self, cpus: float, gpus: float) -> bool:
        """Whether starting a job of (cpus, gpus) keeps the project within its guarantee."""
        q = self.quota
        return self.cpus + cpus <= q.guaranteed_cpus + EPS and self.gpus + gpus <= q.guaranteed_gpus + EPS

    def over_guarantee(self) -> bool:
        q = self.quota
        return self.cpus > q.guaranteed_cpus + EPS or self.gpus > q.guaranteed_gpus + EPS

    def quota_block(self, cpus: float, gpus: float) -> str | None:
        """Why a job of (cpus, gpus) waits for the project's quota; None when it may start."""
        q = self.quota
        if q.max_running is not None and self.running + 1 > q.max_running:
            return f"waiting for quota: project {self.name} uses {self.running} of {q.max_running} running jobs"
        for need, limit, what in ((gpus, q.max_gpus, "GPUs"), (cpus, q.max_cpus, "CPUs")):
            if limit is not None and need > limit + EPS:  # never, whatever the project's other jobs do
                return (
                    f"waiting for quota: the job needs {need:g} {what} to start, more than project {self.name}'s "
                    f"max_{what.lower()} ({limit:g}): ask for less (scaling.num_workers, an elastic job's min; a "
                    "search's max_concurrent_trials) or raise the quota"
                )
        if q.max_gpus is not None and gpus > 0 and self.gpus + gpus > q.max_gpus + EPS:
            return f"waiting for quota: project {self.name} uses {self.gpus:g} of {q.max_gpus:g} GPUs"
        if q.max_cpus is not None and cpus > 0 and self.cpus + cpus > q.max_cpus + EPS:
            return f"waiting for quota: project {self.name} uses {self.cpus:g} of {q.max_cpus:g} CPUs"
        return None

    def admit(self, cpus: float, gpus: float) -> None:
        self.cpus, self.gpus, self.running = self.cpus + cpus, self.gpus + gpus, self.running + 1

    def release(self, cpus: float, gpus: float) -> None:
        self.cpus, self.gpus, self.running = self.cpus - cpus, self.gpus - gpus, self.running - 1


def order_key(
    load: ProjectLoad, cpus: float, gpus: float, priority: int, queued_at: datetime | None, job_id: str
) -> tuple:
    """The admission order of one waiting job of ``load``'s project (smaller first)."""
    return (
        0 if load.within_guarantee(cpus, gpus) else 1,
        load.gpu_seconds,
        load.cpu_seconds,
        -priority,
        queued_at or EARLIEST,
        job_id,
    )


@dataclass(frozen=True)
class Running:
    """A started job as preemption sees it."""

    id: str
    project: str
    cpus: float
    gpus: float
    started_at: datetime | None
    borrowed: bool


def victims(
    running: list[Running], loads: dict[str, ProjectLoad], need: tuple[float, float], for_project: str
) -> list[str]:
    """The borrowed jobs to preempt so that (CPUs, GPUs) ``need`` more are free for a job of
    ``for_project`` within its guarantee: of projects over their guarantee, the most recently
    started first. Empty when preempting all of them would not make the room."""
    need_cpus, need_gpus = need
    candidates = [
        r
        for r in running
        if r.borrowed and r.project != for_project and r.project in loads and loads[r.project].over_guarantee()
    ]
    candidates.sort(key=lambda r: r.started_at or EARLIEST, reverse=True)
    chosen, cpus, gpus = [], 0.0, 0.0
    for r in candidates:
        if (need_cpus <= EPS or r.cpus <= EPS) and (need_gpus <= EPS or r.gpus <= EPS):
            continue  # frees nothing that is short
        chosen.append(r.id)
        cpus, gpus = cpus + r.cpus, gpus + r.gpus
        if cpus + EPS >= need_cpus and gpus + EPS >= need_gpus:
            return chosen
    return []
