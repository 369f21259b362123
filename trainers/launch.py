"""What the server hands a job's driver on the cluster: the job's id, its storage
prefix, its spec and the events channel back to the server (with this attempt's token).

The server writes them to a launch file (``api.schemas.launch.LaunchFile``) under the job's own storage prefix (mode 0600)
and gives the job only its URI, ``RAYDOCK_LAUNCH_URI``: the environment is size-limited
(a big spec would break the driver's start) and Ray's job list shows every job's
``runtime_env`` env_vars to every other job, so no token may travel there.

Every job on a Ray cluster runs as the same OS user and can read the same storage, so
the file is no secret from other jobs: the driver deletes it as soon as it has read it
(``take_launch``), and hands the events channel (URL, token, submission id) to the other
processes that send events (the Train controller) inside its callbacks, not through the
file. The token is good only for this attempt's Ray submission id, which every push names.
For the same reason the file is no proof of itself: the server names the sha256 of the
bytes it wrote in ``RAYDOCK_LAUNCH_SHA256`` (an environment no other job can change), and
a file that does not hash to it is refused (``LaunchAltered``), not run.
Without a launch URI (a driver run by hand) the job's facts are read from ``RAYDOCK_JOB_ID``, ``RAYDOCK_JOB_SPEC``,
``RAYDOCK_STORAGE_PATH``, ``RAYDOCK_EVENTS_URL`` and ``RAYDOCK_EVENTS_TOKEN`` instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from api import object_store
from api.cluster_contract import (
    EVENTS_TOKEN_ENV,
    EVENTS_URL_ENV,
    JOB_ID_ENV,
    LAUNCH_SHA256_ENV,
    LAUNCH_URI_ENV,
    SPEC_ENV,
    STORAGE_PATH_ENV,
)
from api.schemas.launch import LaunchFile


@dataclass(frozen=True)
class Launch:
    job_id: str | None
    storage_path: str | None
    spec: dict[str, Any] | None  # the job spec as JSON; the driver validates it
    events_url: str | None  # None: events go to the log only
    events_token: str | None
    attempt: int | None = None
    submission_id: str | None = None  # the Ray submission id of this attempt, named by every push
    # The workers' resources the driver's Ray job holds: it runs them as local ranks (trainers.ranks).
    local_ranks: dict[str, float] | None = None
    trial_ranks: bool = False  # a search: its trials may run their workers as local ranks (tuning.trial_ranks)
    init_checkpoint: str | None = None  # the checkpoint the run starts from (init_from), until it has its own

    @property
    def channel(self) -> EventsChannel:
        return EventsChannel(self.events_url, self.events_token, self.submission_id)


@dataclass(frozen=True)
class EventsChannel:
    """Where a process of the job posts its events, and what each post names."""

    url: str | None
    token: str | None
    submission_id: str | None


class LaunchAltered(RuntimeError):
    """The launch file's bytes are not those the server wrote."""


def _checked(uri: str, data: bytes) -> bytes:
    expected = os.environ.get(LAUNCH_SHA256_ENV)
    if expected and (got := hashlib.sha256(data).hexdigest()) != expected:
        raise LaunchAltered(
            f"The launch file {uri} hashes to sha256 {got}, not {expected} as the server wrote it "
            f"({LAUNCH_SHA256_ENV}): something else on the cluster rewrote it, so this attempt does not run. "
            "Resume the job to start a new attempt with a fresh launch file."
        )
    return data


def _delete_uri(uri: str) -> None:
    if "://" not in uri or uri.startswith("file://"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(uri.removeprefix("file://"))
        return
    fs, path = object_store.filesystem(uri)
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_file(path)


def _read_uri(uri: str) -> bytes:
    if "://" not in uri or uri.startswith("file://"):
        with open(uri.removeprefix("file://"), "rb") as f:
            return f.read()
    fs, path = object_store.filesystem(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


@functools.cache
def read_launch() -> Launch:
    """The launch of the job this process belongs to."""
    if uri := os.environ.get(LAUNCH_URI_ENV):
        data = LaunchFile.model_validate_json(_checked(uri, _read_uri(uri)))
        return Launch(
            job_id=data.job_id,
            storage_path=data.storage_path,
            spec=data.spec,
            events_url=data.events_url or None,
            events_token=data.events_token or None,
            attempt=data.attempt,
            submission_id=data.submission_id,
            local_ranks=data.local_ranks or None,
            trial_ranks=data.trial_ranks,
            init_checkpoint=data.init_checkpoint,
        )
    spec = os.environ.get(SPEC_ENV)
    return Launch(
        job_id=os.environ.get(JOB_ID_ENV),
        storage_path=os.environ.get(STORAGE_PATH_ENV),
        spec=json.loads(spec) if spec else None,
        events_url=os.environ.get(EVENTS_URL_ENV) or None,
        events_token=os.environ.get(EVENTS_TOKEN_ENV) or None,
    )


def take_launch() -> Launch:
    """The launch, read by the job's driver, which then deletes the launch file: the
    token in it is readable by every job of the cluster for as long as the file exists."""
    launch = read_launch()
    if uri := os.environ.get(LAUNCH_URI_ENV):
        _delete_uri(uri)
    return launch
