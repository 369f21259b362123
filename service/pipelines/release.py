"""The monitor's step for waiting jobs (``JobStatus.WAITING``): each pass, before
admission, a job whose dependencies all ended as it asked joins the queue (QUEUED, its
``init_from`` checkpoint resolved and stored with the move), and one whose dependency
ended otherwise (or was deleted, or left no checkpoint to start from) is CANCELLED with a
reason that names it, whether or not its other dependencies ended yet. A job stopped so
stops the jobs waiting on it in the same pass. A job that still waits has its reason name
the dependencies it still waits for, as each of the others ends.

Its moves are written under the monitor's lease (``Fence``): a replica paused past its
lease moves nothing, so no step is queued (and started) twice; each move is also a
compare-and-set from WAITING (``lifecycle.transition``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.schemas import JobStatus
from api.schemas.dependencies import satisfied
from service import lifecycle
from service.db.leases import Fence
from service.db.models import JobRow
from service.job_reads import JobReads
from service.pipelines import dependencies, outputs

log = logging.getLogger("raydock.pipelines")

WAITING = JobStatus.WAITING.value
MAX_ROUNDS = 64  # a stop passes down a chain of waiting jobs one round each, within one pass
QUEUE_REASON = "its dependencies ended as asked: waiting to be scheduled"


@dataclass(frozen=True)
class Move:
    job_id: str
    target: JobStatus
    reason: str
    checked: tuple[tuple[str, str], ...]  # (dependency, status it was read in): checked again as it is written
    init_checkpoint: str | None = None


class Release:
    def __init__(self, sessions: sessionmaker, reads: JobReads):
        self.sessions = sessions
        self.reads = reads

    def release(self, fence: Fence | None = None) -> int:
        """Queue or stop the waiting jobs whose dependencies decided it; returns how many moved."""
        moved = 0
        for _ in range(MAX_ROUNDS):
            moves = self._decide()
            if not moves:
                break
            done = self._apply(moves, fence)
            moved += done
            if not done or all(m.target != JobStatus.CANCELLED for m in moves):
                break  # nothing stopped: no waiting job learns anything more this pass
        return moved

    def _decide(self) -> list[Move]:
        with self.sessions() as s:
            waiting = s.execute(
                select(JobRow.id, JobRow.spec, JobRow.status_reason).where(JobRow.status == WAITING)
            ).all()
            if not waiting:
                return []
            wants = {row.id: dependencies.effective(row.spec or {}) for row in waiting}
            ids = {d for deps in wants.values() for d, _ in deps}
            columns = (JobRow.id, JobRow.status, JobRow.kind, JobRow.labels, JobRow.spec)
            deps = {r.id: r for r in s.execute(select(*columns).where(JobRow.id.in_(ids)))} if ids else {}
            moves = []
            for row in waiting:
                move = self._decide_one(s, row, wants[row.id], deps)
                if move is not None:
                    moves.append(move)
            return moves

    def _decide_one(self, s, row, wants: list[tuple[str, str]], deps: dict[str, Any]) -> Move | None:
        checked, still = [], []
        for dep_id, wanted in wants:
            dep = deps.get(dep_id)
            if dep is None:
                return Move(row.id, JobStatus.CANCELLED, f"not run: job {dep_id}, which it runs after, was deleted", ())
            status = JobStatus(dep.status)
            if not status.is_terminal():
                still.append((dep_id, wanted))
                continue
            checked.append((dep_id, status.value))
            if not satisfied(wanted, status.value):
                why = f"not run: {dependencies.name(dep_id, dep.labels)} ended {status.value}"
                return Move(row.id, JobStatus.CANCELLED, f"{why} ({dependencies.WAITS[wanted]} was asked)", ())
        if still:  # its reason names what it still waits for ("resumed: ..." kept while that is all of it)
            reason = dependencies.waiting_reason(still, {d: deps[d].labels for d, _ in still})
            said = row.status_reason or ""
            return None if said.endswith(reason) else Move(row.id, JobStatus.WAITING, reason, tuple(checked))
        init = (row.spec or {}).get("init_from")
        path = None
        if isinstance(init, dict) and init.get("job"):
            dep = deps[init["job"]]
            choice = init.get("checkpoint") or "best"
            try:
                path = outputs.resolve(s, self.reads, dep.id, dep.kind, dep.spec or {}, choice)
            except OSError as exc:  # storage that does not answer now: the job waits, never stopped for it
                log.warning("job %s: the checkpoints of %s cannot be listed now (%s); tried again", row.id, dep.id, exc)
                return None
            if path is None:
                why = f"not run: {dependencies.name(dep.id, dep.labels)} left no complete checkpoint to start from"
                return Move(row.id, JobStatus.CANCELLED, f"{why} (init_from, {choice})", ())
        return Move(row.id, JobStatus.QUEUED, QUEUE_REASON, tuple(checked), path)

    def _apply(self, moves: list[Move], fence: Fence | None) -> int:
        done = 0
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)  # first: a take-over waits for these moves, or refuses them
            ids = {d for m in moves for d, _ in m.checked}
            now = dict(s.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(ids))).all()) if ids else {}
            for m in sorted(moves, key=lambda m: m.job_id):  # row locks in id order (see lifecycle.transition_many)
                if any(now.get(d) != status for d, status in m.checked):
                    continue  # a dependency was resumed meanwhile: decided again next pass
                job = s.get(JobRow, m.job_id)
                if job is None or job.status != WAITING:
                    continue
                if m.target == JobStatus.WAITING:  # it still waits: only its reason changes (not counted)
                    job.status_reason = m.reason
                    continue
                also = {"init_checkpoint": m.init_checkpoint} if m.target == JobStatus.QUEUED else None
                if lifecycle.transition(s, job, m.target, reason=m.reason, also=also):
                    done += 1
        if done:
            log.info("%d waiting job(s) queued or stopped by their dependencies", done)
        return done
