"""A simulated day of submissions from three projects with different guarantees, admitted
by raydock's admission logic (``service.scheduling.admission.plan`` over ``fair_order``, the
project loads, quotas and preemption choice of ``service.scheduling.fair_share``) against a
fake 16-CPU cluster on a simulated clock, side by side with plain FIFO (the same ``plan``
over one queue in arrival order). No Ray, no server: a job "finishes" after its duration;
a preempted job checkpoints, loses a minute to its restart and goes back to the queue.

    python -m bench.fair_share            # < 10 s

Prints each project's share of the cluster's CPU-time against its guarantee, its median
and 90th-percentile wait (submit -> first start) and how often its jobs were preempted.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from service.scheduling import admission
from service.scheduling.fair_share import ProjectLoad, Quota, Running, decay, victims

CAPACITY = 16.0
DAY_S = 86_400
TICK_S = 60
HALF_LIFE_S = 3600.0
RESTART_S = 60  # what a preemption costs its job (the checkpoint keeps its progress)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
# name, guaranteed CPUs, jobs per hour, CPUs per job, duration range (minutes)
PROJECTS = [
    ("research", 8.0, 2.0, (2, 4), (30, 120)),  # guaranteed half the cluster, submits steadily
    ("prod", 6.0, 1.5, (2, 4), (20, 60)),  # guaranteed 6, submits less
    ("adhoc", 0.0, 5.0, (1, 4), (20, 90)),  # no guarantee, floods the queue
]


@dataclass
class Job:
    id: str
    project: str
    cpus: float
    duration_s: float
    submitted: float
    left_s: float = 0.0
    first_start: float | None = None
    started: float | None = None
    queued_at: float = 0.0
    borrowed: bool = False
    preempted: int = 0


@dataclass
class Sim:
    fair: bool
    jobs: list[Job]
    now: float = 0.0
    queue: list[Job] = field(default_factory=list)
    running: list[Job] = field(default_factory=list)
    used: dict[str, float] = field(default_factory=dict)  # CPU-seconds within the day
    decayed: dict[str, tuple[float, float]] = field(default_factory=dict)  # (value, as_of)

    def run(self) -> None:
        pending = sorted(self.jobs, key=lambda j: j.submitted)
        while self.now < DAY_S:
            while pending and pending[0].submitted <= self.now:
                job = pending.pop(0)
                job.left_s, job.queued_at = job.duration_s, job.submitted
                self.queue.append(job)
            for job in list(self.running):
                ran = min(TICK_S, job.left_s)
                self.used[job.project] = self.used.get(job.project, 0.0) + job.cpus * ran
                self._decayed_add(job.project, job.cpus * ran)
                job.left_s -= ran
                if job.left_s <= 0:
                    self.running.remove(job)
            self._admit()
            self.now += TICK_S

    def _decayed_add(self, project: str, cpu_s: float) -> None:
        value, as_of = self.decayed.get(project, (0.0, self.now))
        self.decayed[project] = (decay(value, _at(as_of), _at(self.now), HALF_LIFE_S) + cpu_s, self.now)

    def _loads(self) -> dict[str, ProjectLoad]:
        loads = {name: ProjectLoad(name, Quota(guaranteed_cpus=g)) for name, g, *_ in PROJECTS}
        for job in self.running:
            loads[job.project].admit(job.cpus, 0.0)
        for name, (value, as_of) in self.decayed.items():
            loads[name].cpu_seconds = decay(value, _at(as_of), _at(self.now), HALF_LIFE_S)
        return loads

    def _admit(self) -> None:
        free = CAPACITY - sum(j.cpus for j in self.running)
        by_id = {j.id: j for j in self.queue}
        queued = lambda j: admission.Queued(j.id, j.cpus, 0.0, _at(j.queued_at), project=j.project)  # noqa: E731
        if self.fair:
            loads = self._loads()
            line = sorted(self.queue, key=lambda j: j.queued_at)
            heads = {p: iter([queued(j) for j in line if j.project == p]) for p in loads}
            plan = admission.plan(admission.fair_order(heads, loads), (free, 0.0), None, loads)
        else:
            plan = admission.plan((queued(j) for j in sorted(self.queue, key=lambda j: j.queued_at)), (free, 0.0))
        for job_id in plan.start:
            job = by_id[job_id]
            self.queue.remove(job)
            job.started, job.borrowed = self.now, job_id in plan.borrowed
            job.first_start = self.now if job.first_start is None else job.first_start
            self.running.append(job)
        if self.fair and plan.wants is not None:
            wanting, need = plan.wants
            running = [Running(j.id, j.project, j.cpus, 0.0, _at(j.started), j.borrowed) for j in self.running]
            for victim in victims(running, loads, need, wanting.project):
                job = next(j for j in self.running if j.id == victim)
                self.running.remove(job)
                job.preempted += 1
                job.left_s += RESTART_S
                job.queued_at = self.now
                self.queue.append(job)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def day(seed: int = 7) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for name, _, per_hour, (lo_cpu, hi_cpu), (lo_min, hi_min) in PROJECTS:
        t = 0.0
        while True:
            t += rng.expovariate(per_hour / 3600)
            if t >= DAY_S * 0.9:  # the last hours drain the queue
                break
            cpus = float(rng.randint(lo_cpu, hi_cpu))
            jobs.append(Job(f"{name}-{len(jobs)}", name, cpus, rng.uniform(lo_min, hi_min) * 60, t))
    return jobs


def report(sim: Sim) -> dict[str, tuple[float, float, float, float, int, int]]:
    out = {}
    for name, *_ in PROJECTS:
        mine = [j for j in sim.jobs if j.project == name]
        waits = sorted((j.first_start if j.first_start is not None else DAY_S) - j.submitted for j in mine)
        p90 = waits[int(0.9 * (len(waits) - 1))] / 60 if waits else 0.0
        share = sim.used.get(name, 0.0) / (CAPACITY * DAY_S)
        offered = sum(j.cpus * j.duration_s for j in mine) / (CAPACITY * DAY_S)
        out[name] = (
            offered,
            share,
            statistics.median(waits) / 60 if waits else 0.0,
            p90,
            sum(j.preempted for j in mine),
            len(mine),
        )
    return out


def main() -> None:
    demand = sum(j.cpus * j.duration_s for j in day()) / (CAPACITY * DAY_S * 0.9)
    print(f"{CAPACITY:g} CPUs, one simulated day, offered load {demand:.2f}x the cluster over the submit hours")
    fair, fifo = Sim(True, day()), Sim(False, day())
    fair.run(), fifo.run()
    a, b = report(fair), report(fifo)
    print(
        f"{'project':<10}{'guarantee':>10}{'offered':>8}{'jobs':>6} | {'fair share':>10}{'median wait':>12}{'p90 wait':>10}{'preempted':>10} |"
        f" {'FIFO share':>10}{'median wait':>12}{'p90 wait':>10}"
    )
    for name, g, *_ in PROJECTS:
        offered, s1, m1, p1, pre, n = a[name]
        _, s2, m2, p2, _, _ = b[name]
        print(
            f"{name:<10}{g / CAPACITY:>10.0%}{offered:>8.0%}{n:>6} | {s1:>10.1%}{m1:>10.0f} m{p1:>8.0f} m{pre:>10} |"
            f" {s2:>10.1%}{m2:>10.0f} m{p2:>8.0f} m"
        )


if __name__ == "__main__":
    main()
