"""Uploaded code packages: receive, check, store, reference and collect them.

A package is the zip the SDK or CLI makes of a job's directory (``api/code_package.py``),
named by its sha256. ``receive`` takes the bytes of ``PUT /v1/code/{sha256}`` into a
temp file under the data dir, counting them against ``RAYDOCK_CODE_MAX_BYTES`` as they
arrive; the hash of what arrived must be the name, and the zip must be safe to unpack
(``check_zip``). Only then is it stored, at ``<storage>/_code/<sha256>.zip``, and
recorded: a refused, broken or half-received upload leaves nothing behind.

Packages are held per project (``code_refs``): the same bytes uploaded by two projects
are two references to one stored file, and a project sees, probes and runs only the
packages it holds (another project's reads as missing, so a hash cannot be probed), and
its record says when that project first uploaded it and last used it, never another's. A
project's hold lapses ``RAYDOCK_CODE_RETENTION_S`` after its last use unless a job of it
runs the package.

A job names its package as ``code: sha256:<hex>``; the submit records the reference in
the job's transaction (``reference``), and Ray gets the package's URI as the job's
``working_dir``. A package that no job references is deleted ``RAYDOCK_CODE_RETENTION_S``
after its last upload or submit (``collect``, from the monitor).

Error codes: ``code_hash_mismatch``, ``code_package_invalid``, ``code_package_unsafe``,
``code_name_reserved`` (422), ``code_too_large`` (413 for bytes, 422 for files), ``code_package_not_found``
(404 on the code routes, 422 in a job spec), ``code_package_altered`` (409: the stored bytes no longer match
the name; checked on every use, and at every attempt's start by service/attempts.py), ``code_quota_exceeded``
(413, past the project's ``RAYDOCK_CODE_QUOTA_BYTES``: ``service/code/quota.py``). How many uploads run at once
and how fast they must arrive is the route's concern (``service/http/routes/code.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import AsyncIterator

from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.code_package import module_in_package, reserved_names
from api.errors import CodeTooLarge, Conflict, InvalidSpec, NotFound
from api.schemas import CODE_REF_PREFIX, CodeLimits, CodePackagePublic
from service.code import quota
from service.code.package_zip import check_zip
from service.db.leases import Fence
from service.db.models import CodePackageRow, JobCodeRow, JobRow, count, utcnow
from service.db.tenancy_models import CodeRefRow
from service.eventlog.log import SYSTEM, record
from service.files import storage
from service.settings import Settings

log = logging.getLogger("raydock.code")

CODE_DIR = "_code"  # under the storage path, beside the jobs' prefixes (job ids start with "j")
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    package: CodePackagePublic
    created: bool  # False: the server had it already


class CodeStore:
    def __init__(self, settings: Settings, sessions: sessionmaker):
        self.settings, self.sessions = settings, sessions
        self.incoming = settings.storage.data_dir / "code-incoming"
        self._lock = threading.Lock()  # a store and a collection of the same package never interleave here

    @property
    def collect_every_s(self) -> float:
        """How often ``collect`` runs: a fraction of the retention period, within [1 s, 5 min]."""
        return min(300.0, max(1.0, self.settings.code.code_retention_s / 4))

    def limits(self) -> CodeLimits:
        s = self.settings.code
        return CodeLimits(max_bytes=s.code_max_bytes, max_files=s.code_max_files, retention_s=s.code_retention_s)

    @property
    def folder(self) -> str:
        """Where the packages are stored: under the storage path, which jobs can write too."""
        return storage.join(self.settings.storage.resolved_storage_path, CODE_DIR)

    def uri(self, sha256: str) -> str:
        return storage.join(self.folder, f"{sha256}.zip")

    def fetch_uri(self, sha256: str) -> str:
        """What Ray is given as the job's ``working_dir``."""
        return storage.fetch_uri(self.uri(sha256))

    # ------------------------------------------------------------------ read

    def get(self, sha256: str, project: str, *, check: bool = False) -> CodePackagePublic:
        """The package's record as ``project`` holds it (its jobs only); ``check``: only if
        its stored bytes still match its name."""
        with self.sessions() as s:
            row, ref = s.get(CodePackageRow, sha256), s.get(CodeRefRow, (project, sha256))
            if row is None or ref is None:
                raise _not_found(sha256)
            jobs = count(
                s,
                JobCodeRow,
                JobCodeRow.sha256 == sha256,
                JobCodeRow.job_id.in_(select(JobRow.id).where(JobRow.project == project)),
            )
            public = _public(row, ref, jobs)
        if check and not self.verify(sha256):
            raise altered(sha256)
        return public

    # ------------------------------------------------------------------ upload

    async def receive(
        self, sha256: str, declared: int | None, body: AsyncIterator[bytes], project: str, *, actor: str = SYSTEM
    ) -> Stored:
        """Take an upload: counted and hashed as it arrives, checked, then stored."""
        cap = self.settings.code.code_max_bytes
        if declared is not None and declared > cap:
            raise _too_large_body(declared, cap)
        # The database, the zip check and the copy into storage run off the event loop:
        # a large package must not stall the server's other requests.
        if (known := await asyncio.to_thread(self.touch, sha256, project)) is not None:
            return Stored(known, created=False)  # nothing read: the project holds these bytes
        if declared is not None:
            await asyncio.to_thread(self._check_quota, project, declared)  # before a byte is read
        self.incoming.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.incoming, prefix=f"{sha256[:12]}-", suffix=".zip")
        try:
            digest, received = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as f:
                async for chunk in body:
                    received += len(chunk)
                    if received > cap:
                        raise _too_large_body(received, cap)
                    digest.update(chunk)
                    f.write(chunk)
            if digest.hexdigest() != sha256:
                raise InvalidSpec(
                    f"The uploaded bytes ({received}) have sha256 {digest.hexdigest()}, not {sha256}: the upload was "
                    "changed or cut on the way. Upload again (the CLI and SDK name the package by its hash).",
                    code="code_hash_mismatch",
                )
            files, content = await asyncio.to_thread(check_zip, Path(tmp), self.settings)
            return await asyncio.to_thread(self._store, sha256, Path(tmp), received, files, content, project, actor)
        finally:
            # Refused, cut off (the client went away mid-body) or stored: the temp file goes.
            Path(tmp).unlink(missing_ok=True)

    def touch(self, sha256: str, project: str) -> CodePackagePublic | None:
        """The package, with its retention restarted, if ``project`` holds it (a row, and a
        file whose bytes still hash to its name: one rewritten in storage counts as
        missing, so the next upload of the real bytes replaces it)."""
        with self.sessions.begin() as s:
            row = s.get(CodePackageRow, sha256)
            ref = s.get(CodeRefRow, (project, sha256))
            if row is None or ref is None or not self.verify(sha256):
                return None
            row.last_used_at = ref.last_used_at = utcnow()
        return self.get(sha256, project)

    def verify(self, sha256: str) -> bool:
        """Whether the stored package's bytes still hash to its name. Jobs can reach the
        storage path, so a package is checked whenever it is about to be used; reading
        stops past the byte cap (a file grown in place is no package of ours)."""
        if not storage.exists(self.uri(sha256)):
            return False
        digest, size = hashlib.sha256(), 0
        try:
            with storage.open_random_access(self.uri(sha256)) as f:  # a regular file, no link followed
                while chunk := f.read(READ_CHUNK):
                    size += len(chunk)
                    if size > self.settings.code.code_max_bytes:
                        break
                    digest.update(chunk)
        except OSError as exc:  # swapped for a FIFO, a link or a directory: no package of ours
            log.warning("code package %s is no longer a readable file in storage: %s", sha256[:12], exc)
            return False
        if size <= self.settings.code.code_max_bytes and digest.hexdigest() == sha256:
            return True
        log.warning("code package %s no longer matches its hash in storage: it was changed after upload", sha256[:12])
        return False

    def _check_quota(self, project: str, size: int, sha256: str | None = None) -> None:
        with self.sessions() as s:
            if sha256 is not None and s.get(CodeRefRow, (project, sha256)) is not None:
                return  # the project holds it already: storing it again adds nothing
            quota.check(s, project, size, self.settings.code.code_quota_bytes, self.settings.code.code_retention_s)

    def _store(self, sha256: str, tmp: Path, size: int, files: int, content: int, project: str, actor: str) -> Stored:
        with self._lock:
            self._check_quota(project, size, sha256)
            storage.put_file(str(tmp), self.folder, f"{sha256}.zip")
            try:
                with self.sessions.begin() as s:
                    row = s.get(CodePackageRow, sha256)
                    if row is None:
                        s.add(CodePackageRow(sha256=sha256, size_bytes=size, files=files, content_bytes=content))
                    else:
                        row.last_used_at = utcnow()  # the file was missing, or another project holds it
                    created = s.get(CodeRefRow, (project, sha256)) is None
                    if created:
                        now = utcnow()
                        s.add(CodeRefRow(project=project, sha256=sha256, created_at=now, last_used_at=now))
                        record(
                            s,
                            "code_uploaded",
                            actor=actor,
                            sha256=sha256,
                            size_bytes=size,
                            files=files,
                            project=project,
                        )
            except IntegrityError:
                created = False  # a concurrent upload of the same bytes recorded it first
        return Stored(self.get(sha256, project), created)

    # ------------------------------------------------------------------ jobs

    def check_ref(self, ref: str, entrypoint: str | None, loc: list, project: str) -> str:
        """The sha256 of a spec's ``code`` reference, once ``project`` holds the package and
        it holds the entrypoint's module; its retention restarts (the submit references it next)."""
        sha256 = ref.removeprefix(CODE_REF_PREFIX)
        if self.touch(sha256, project) is None:
            raise InvalidSpec(
                f"code {ref} is not in project {project!r} on this server: upload the package first (PUT /v1/code/{sha256}; "
                "`raydock submit` and Client.submit do it for a spec with a working_dir).",
                code="code_package_not_found",
                details=[{"loc": loc + ["code"], "msg": "unknown package"}],
            )
        try:
            with storage.open_random_access(self.uri(sha256)) as f, zipfile.ZipFile(f) as zf:
                names = set(zf.namelist())
        except (OSError, zipfile.BadZipFile):  # replaced in storage since it was uploaded
            raise InvalidSpec(
                f"code {ref} is no longer a readable package on this server: upload it again (PUT /v1/code/{sha256}).",
                code="code_package_unreadable",
                details=[{"loc": loc + ["code"], "msg": "unreadable package"}],
            ) from None
        if taken := reserved_names(names):
            raise InvalidSpec(
                f"The uploaded code defines {', '.join(taken)} at its top level, which are raydock's own packages on the "
                "cluster (its job drivers start from them): rename your package, or move it one directory down.",
                code="code_name_reserved",
                details=[{"loc": loc + ["code"], "msg": f"reserved: {', '.join(taken)}"}],
            )
        if entrypoint:
            module = entrypoint.split(":")[0]
            if not module_in_package(module, names):
                raise InvalidSpec(
                    f"entrypoint module {module!r} is not in the uploaded code (package {sha256[:12]}). Check the module "
                    "path in `entrypoint`, or set `working_dir` to the directory that contains it.",
                    code="entrypoint_not_found",
                    details=[{"loc": loc + ["entrypoint"], "msg": "module not found"}],
                )
        return sha256

    @staticmethod
    def reference(s: Session, job_id: str, sha256: str) -> None:
        """Record, in the submit's transaction, that the job runs this package."""
        s.flush()  # the job row first: the reference points at it
        s.add(JobCodeRow(job_id=job_id, sha256=sha256))
        s.execute(update(CodePackageRow).where(CodePackageRow.sha256 == sha256).values(last_used_at=utcnow()))

    # ------------------------------------------------------------------ retention

    def _let_go(self, cutoff, fence: Fence | None = None) -> None:
        """End each project's hold on a package it has not used since ``cutoff`` and none
        of its jobs runs (the package itself stays while another project holds it)."""
        runs = exists().where(
            JobCodeRow.sha256 == CodeRefRow.sha256, JobRow.id == JobCodeRow.job_id, JobRow.project == CodeRefRow.project
        )
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            s.execute(
                delete(CodeRefRow).where(CodeRefRow.last_used_at < cutoff, ~runs),
                execution_options={"synchronize_session": False},
            )

    def collect(self, fence: Fence | None = None) -> list[str]:
        """Delete the packages no job references whose last use is older than the
        retention period; returns their hashes. The row goes first: a crash between
        leaves a file no row names, which the next upload of it overwrites. With ``fence``
        (the unit's lease), each delete only while it is held (else LeaseLost)."""
        cutoff = utcnow() - timedelta(seconds=self.settings.code.code_retention_s)
        unreferenced = ~exists().where(JobCodeRow.sha256 == CodePackageRow.sha256)
        gone = []
        with self._lock:
            self._let_go(cutoff, fence)
            with self.sessions() as s:
                due = s.scalars(
                    select(CodePackageRow.sha256).where(CodePackageRow.last_used_at < cutoff, unreferenced)
                ).all()
            for sha256 in due:
                with self.sessions.begin() as s:
                    if fence is not None:
                        fence.hold(s)
                    deleted = s.execute(
                        delete(CodePackageRow).where(
                            CodePackageRow.sha256 == sha256, CodePackageRow.last_used_at < cutoff, unreferenced
                        ),
                        execution_options={"synchronize_session": False},
                    ).rowcount
                    if deleted:
                        s.execute(delete(CodeRefRow).where(CodeRefRow.sha256 == sha256))
                if deleted:
                    storage.remove(self.folder, f"{sha256}.zip")
                    gone.append(sha256)
        if gone:
            log.info("deleted %d code package(s) no job references: %s", len(gone), ", ".join(g[:12] for g in gone))
        return gone


def _too_large_body(size: int, cap: int) -> CodeTooLarge:
    return CodeTooLarge(
        f"The package is {size}+ bytes, more than {cap} (RAYDOCK_CODE_MAX_BYTES). Leave out what the job does not "
        "need (a .gitignore or .rayignore file, runtime_env.excludes), or ask the operator to raise the cap.",
        details=[{"cap": "max_bytes"}],
    )


def altered(sha256: str) -> Conflict:
    return Conflict(
        f"Code package {sha256} was changed in storage after it was uploaded: its bytes no longer hash to its "
        f"name, so the server will not use or describe it. Upload it again (PUT /v1/code/{sha256}; `raydock submit` "
        "and Client.submit do) and tell the operator: the storage path's _code/ directory is writable by someone.",
        code="code_package_altered",
    )


def _not_found(sha256: str) -> NotFound:
    return NotFound(f"No code package {sha256}. Upload it with PUT /v1/code/{sha256}.", code="code_package_not_found")


def _public(row: CodePackageRow, ref: CodeRefRow, jobs: int) -> CodePackagePublic:
    """The package as its project holds it: when that project first uploaded it and last
    used it, never another project's times (the bytes are stored once for all of them)."""
    return CodePackagePublic(
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        files=row.files,
        content_bytes=row.content_bytes,
        created_at=ref.created_at,
        last_used_at=ref.last_used_at or ref.created_at,
        jobs=jobs,
    )
