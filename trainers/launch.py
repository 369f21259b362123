"""What the server hands a job's driver on the cluster: the job's id, its storage
prefix, its spec and the events channel back to the server.

Read in one place (``read_launch``) by both Ray job drivers and by the events transport
in every process of the job (the Train controller sends events too).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any

JOB_ID_ENV = "RAYDOCK_JOB_ID"
SPEC_ENV = "RAYDOCK_JOB_SPEC"
STORAGE_PATH_ENV = "RAYDOCK_STORAGE_PATH"
EVENTS_URL_ENV = "RAYDOCK_EVENTS_URL"
EVENTS_TOKEN_ENV = "RAYDOCK_EVENTS_TOKEN"


@dataclass(frozen=True)
class Launch:
    job_id: str | None
    storage_path: str | None
    spec: dict[str, Any] | None  # the job spec as JSON; the driver validates it
    events_url: str | None  # None: events go to the log only
    events_token: str | None


@functools.cache
def read_launch() -> Launch:
    """The launch of the job this process belongs to (the runtime env's variables)."""
    spec = os.environ.get(SPEC_ENV)
    return Launch(
        job_id=os.environ.get(JOB_ID_ENV),
        storage_path=os.environ.get(STORAGE_PATH_ENV),
        spec=json.loads(spec) if spec else None,
        events_url=os.environ.get(EVENTS_URL_ENV) or None,
        events_token=os.environ.get(EVENTS_TOKEN_ENV) or None,
    )
