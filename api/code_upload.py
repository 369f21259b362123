"""Uploading a job's code from the client: what ``Client.upload_code`` and
``Client.submit`` do with a spec's local ``working_dir``.

The directory is packaged (``api/code_package.py``) within the server's caps (asked once
from ``GET /v1/code``), then ``HEAD /v1/code/{sha256}`` says whether the server has those
bytes; only when it answers 404 is the zip sent, streamed, with ``PUT`` (again after the
server's Retry-After while it answers 429 ``too_many_uploads``, for up to ``BUSY_WAIT_S``).
The spec then names the package (``code: sha256:<hex>``) instead of the directory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import httpx

from api.code_package import Package, build_package
from api.errors import Busy
from api.schemas import CodeLimits, JobSpec, code_spec


class Client(Protocol):
    """What of ``api.client.Client`` an upload uses."""

    http: httpx.Client

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...


Progress = Callable[[str, int, int], None]  # (phase "files" | "bytes", done, total)
PIECE = 256 * 1024
UPLOAD_TIMEOUT = httpx.Timeout(30.0, read=600.0, write=600.0)
BUSY_WAIT_S = 120.0  # how long an upload waits in all for a busy server (429 too_many_uploads)


@dataclass
class CodeUpload:
    """What an upload did. ``status`` is the server's answer: 201 stored now, 200 it had
    the package already (``sent_bytes`` 0: nothing was sent)."""

    sha256: str
    files: int
    size_bytes: int
    content_bytes: int
    status: int
    sent_bytes: int
    left_out: list[tuple[str, int]] = field(default_factory=list)  # data files over the size threshold

    @property
    def ref(self) -> str:
        return f"sha256:{self.sha256}"


def upload_code(
    client: Client,
    directory: str | os.PathLike,
    excludes: list[str] | None = None,
    progress: Progress | None = None,
    project: str | None = None,
) -> CodeUpload:
    """``project``: the project that will hold the package (None: the caller's default)."""
    limits = CodeLimits.model_validate(client.request("GET", "/v1/code").json())
    package = build_package(
        directory, excludes, max_bytes=limits.max_bytes, max_files=limits.max_files, progress=progress
    )
    try:
        return _send(client, package, progress, {"project": project} if project else {})
    finally:
        package.discard()


def _send(client: Client, package: Package, progress: Progress | None, params: dict[str, str]) -> CodeUpload:
    path = f"/v1/code/{package.sha256}"
    facts = dict(
        sha256=package.sha256,
        files=package.files,
        size_bytes=package.size,
        content_bytes=package.content_bytes,
        left_out=package.left_out,
    )
    if client.http.head(path, params=params).status_code == 200:
        return CodeUpload(**facts, status=200, sent_bytes=0)

    def pieces() -> Iterator[bytes]:
        sent = 0
        with open(package.path, "rb") as f:
            while piece := f.read(PIECE):
                sent += len(piece)
                yield piece
                if progress is not None:
                    progress("bytes", sent, package.size)

    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(package.size)}
    waited = 0.0
    while True:
        try:
            r = client.request("PUT", path, content=pieces(), headers=headers, params=params, timeout=UPLOAD_TIMEOUT)
        except Busy as exc:
            # The server takes a bounded number of uploads at once and says when to come back.
            if exc.code != "too_many_uploads" or waited >= BUSY_WAIT_S:
                raise
            pause = min(BUSY_WAIT_S - waited, max(1.0, exc.retry_after_s or 1.0))
            time.sleep(pause)
            waited += pause
            continue
        return CodeUpload(**facts, status=r.status_code, sent_bytes=package.size if r.status_code == 201 else 0)


def with_uploaded_code(
    client: Client, spec: JobSpec, base_dir: str | os.PathLike | None, progress: Progress | None
) -> tuple[JobSpec, CodeUpload | None]:
    """``spec`` with its local ``working_dir`` (relative to ``base_dir``, default the
    current directory) uploaded and named as ``code``; a spec without one as it is."""
    train = code_spec(spec)
    if not train.is_user_code or not train.working_dir:
        return spec, None
    directory = Path(base_dir or ".") / Path(train.working_dir).expanduser()
    excludes = (train.runtime_env or {}).get("excludes")
    excludes = excludes if isinstance(excludes, list) else None
    upload = upload_code(client, directory, excludes, progress, project=spec.project)  # held where the job goes
    spec = spec.model_copy(deep=True)
    train = code_spec(spec)
    train.working_dir, train.code = None, upload.ref
    return spec, upload
