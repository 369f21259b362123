"""When an open stream (a followed log, a job's metrics as server-sent events) ends
before its job does. A stream holds a place of the server's stream cap for as long as it
is open, so a stream of a job that is not running (queued behind others, preempted)
ends after ``RAYDOCK_STREAM_IDLE_S``; and the caller is asked again every
``RAYDOCK_STREAM_RECHECK_S`` (the request guard asked only once, before the stream
opened), so a revoked or expired token, or a member removed from the job's project,
stops reading the job within that time."""

from __future__ import annotations

import time
from dataclasses import dataclass

from api.schemas import JobStatus
from service.db.job_records import LoopReads
from service.http.auth import Authenticator

# A job in these makes progress (or is about to): its stream stays open.
ACTIVE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING})


@dataclass(frozen=True)
class Ending:
    code: str  # not_running | access_ended
    message: str


class Follow:
    def __init__(
        self,
        auth: Authenticator,
        authorization: str | None,
        job_id: str,
        reads: LoopReads,
        *,
        idle_s: float,
        recheck_s: float,
    ) -> None:
        self.auth, self.authorization, self.job_id, self.reads = auth, authorization, job_id, reads
        self.idle_s, self.recheck_s = idle_s, recheck_s
        now = time.monotonic()
        self._waiting_since: float | None = None
        self._next_check = now + recheck_s

    async def ending(self, status: JobStatus) -> Ending | None:
        """Why the stream ends now (its job in ``status`` and not ended), or None."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.recheck_s
            caller = await self.auth.caller(self.authorization)
            project = await self.reads.project(self.job_id)  # None: deleted, which the stream reports itself
            if isinstance(caller, Exception) or (project is not None and not caller.can_read(project)):
                return Ending(
                    "access_ended",
                    f"The stream of job {self.job_id} ended: your token no longer reads it (revoked or expired, "
                    "or you are no longer in its project).",
                )
        if status in ACTIVE:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since >= self.idle_s:
            return Ending(
                "not_running",
                f"The stream of job {self.job_id} ended: the job has not been running for {self.idle_s:g} s "
                f"(it is {status.value}; RAYDOCK_STREAM_IDLE_S). Follow it again once it runs.",
            )
        return None
