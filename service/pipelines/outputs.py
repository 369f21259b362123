"""The checkpoint a job's ``init_from`` starts from, resolved by the server from the
dependency's record when its dependencies have ended: only a checkpoint the server lists
as complete for that job, inside that job's own storage prefix (``JobReads.checkpoints``),
never a path the dependency could name. ``best`` is the one best by the dependency's
``checkpoint.score_metric`` (its latest when it has none), or a search's best trial's;
``latest`` the newest. None: it left no such checkpoint."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from api.schemas import CheckpointPublic
from service.db.event_models import SearchResultRow
from service.job_reads import JobReads


def _score(c: CheckpointPublic, metric: str) -> float | None:
    v = c.metrics.get(metric)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def resolve(s: Session, reads: JobReads, job_id: str, kind: str, spec: dict[str, Any], choice: str) -> str | None:
    listed = reads.checkpoints(job_id)  # complete, still stored, inside the job's prefix
    if not listed:
        return None
    latest = max(listed, key=lambda c: c.id)
    if choice == "latest":
        return latest.path
    if kind == "tune":
        final = s.get(SearchResultRow, job_id)
        paths = {c.path for c in listed}
        return final.checkpoint_path if final is not None and final.checkpoint_path in paths else latest.path
    policy = spec.get("checkpoint") or {}
    metric, mode = policy.get("score_metric"), policy.get("score_mode") or "max"
    if not metric:
        return latest.path
    scored = [(v, c) for c in listed if (v := _score(c, metric)) is not None]
    if not scored:
        return latest.path
    pick = max if mode == "max" else min
    return pick(scored, key=lambda vc: (vc[0], vc[1].id))[1].path
