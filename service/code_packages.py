"""Uploaded code packages: receive, check, store, reference and collect them.

A package is the zip the SDK or CLI makes of a job's directory (``api/code_package.py``),
named by its sha256. ``receive`` takes the bytes of ``PUT /v1/code/{sha256}`` into a
temp file under the data dir, counting them against ``RAYDOCK_CODE_MAX_BYTES`` as they
arrive; the hash of what arrived must be the name, and the zip must be safe to unpack
(``check_zip``). Only then is it stored, at ``<storage>/_code/<sha256>.zip``, and
recorded: a refused, broken or half-received upload leaves nothing behind.

A job names its package as ``code: sha256:<hex>``; the submit records the reference in
the job's transaction (``reference``), and Ray gets the package's URI as the job's
``working_dir``. A package that no job references is deleted ``RAYDOCK_CODE_RETENTION_S``
after its last upload or submit (``collect``, from the monitor).

Error codes: ``code_hash_mismatch``, ``code_package_invalid``, ``code_package_unsafe``,
``code_name_reserved`` (422), ``code_too_large`` (413 for bytes, 422 for files), ``code_package_not_found``
(404 on the code routes, 422 in a job spec).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import logging
import os
import stat
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import AsyncIterator

from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.code_package import TOP, biggest_files, module_in_package, reserved_names
from api.errors import CodeTooLarge, InvalidSpec, NotFound
from api.schemas import CODE_REF_PREFIX, CodeLimits, CodePackagePublic
from service import storage
from service.settings import Settings
from service.store import CodePackageRow, JobCodeRow, count, utcnow

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
        self.incoming = settings.data_dir / "code-incoming"
        self._lock = threading.Lock()  # a store and a collection of the same package never interleave here

    @property
    def collect_every_s(self) -> float:
        """How often ``collect`` runs: a fraction of the retention period, within [1 s, 5 min]."""
        return min(300.0, max(1.0, self.settings.code_retention_s / 4))

    def limits(self) -> CodeLimits:
        s = self.settings
        return CodeLimits(max_bytes=s.code_max_bytes, max_files=s.code_max_files, retention_s=s.code_retention_s)

    def uri(self, sha256: str) -> str:
        return storage.join(self.settings.resolved_storage_path, CODE_DIR, f"{sha256}.zip")

    def fetch_uri(self, sha256: str) -> str:
        """What Ray is given as the job's ``working_dir``."""
        return storage.fetch_uri(self.uri(sha256))

    # ------------------------------------------------------------------ read

    def get(self, sha256: str) -> CodePackagePublic:
        with self.sessions() as s:
            row = s.get(CodePackageRow, sha256)
            if row is None:
                raise _not_found(sha256)
            return _public(row, count(s, JobCodeRow, JobCodeRow.sha256 == sha256))

    # ------------------------------------------------------------------ upload

    async def receive(self, sha256: str, declared: int | None, body: AsyncIterator[bytes]) -> Stored:
        """Take an upload: counted and hashed as it arrives, checked, then stored."""
        cap = self.settings.code_max_bytes
        if declared is not None and declared > cap:
            raise _too_large_body(declared, cap)
        # The database, the zip check and the copy into storage run off the event loop:
        # a large package must not stall the server's other requests.
        if (known := await asyncio.to_thread(self.touch, sha256)) is not None:
            return Stored(known, created=False)  # nothing read: the bytes are known
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
            return await asyncio.to_thread(self._store, sha256, Path(tmp), received, files, content)
        finally:
            # Refused, cut off (the client went away mid-body) or stored: the temp file goes.
            Path(tmp).unlink(missing_ok=True)

    def touch(self, sha256: str) -> CodePackagePublic | None:
        """The package, with its retention restarted, if the server has it (row and file)."""
        with self.sessions.begin() as s:
            row = s.get(CodePackageRow, sha256)
            if row is None or not storage.exists(self.uri(sha256)):
                return None
            row.last_used_at = utcnow()
        return self.get(sha256)

    def _store(self, sha256: str, tmp: Path, size: int, files: int, content: int) -> Stored:
        with self._lock:
            storage.put_file(str(tmp), self.uri(sha256))
            try:
                with self.sessions.begin() as s:
                    row = s.get(CodePackageRow, sha256)
                    created = row is None
                    if created:
                        s.add(CodePackageRow(sha256=sha256, size_bytes=size, files=files, content_bytes=content))
                    else:
                        row.last_used_at = utcnow()  # the file was missing: stored again
            except IntegrityError:
                created = False  # a concurrent upload of the same bytes recorded it first
        return Stored(self.get(sha256), created)

    # ------------------------------------------------------------------ jobs

    def check_ref(self, ref: str, entrypoint: str | None, loc: list) -> str:
        """The sha256 of a spec's ``code`` reference, once the package is known and holds
        the entrypoint's module; its retention restarts (the submit references it next)."""
        sha256 = ref.removeprefix(CODE_REF_PREFIX)
        if self.touch(sha256) is None:
            raise InvalidSpec(
                f"code {ref} is not on this server: upload the package first (PUT /v1/code/{sha256}; "
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

    def collect(self) -> list[str]:
        """Delete the packages no job references whose last use is older than the
        retention period; returns their hashes. The row goes first: a crash between
        leaves a file no row names, which the next upload of it overwrites."""
        cutoff = utcnow() - timedelta(seconds=self.settings.code_retention_s)
        unreferenced = ~exists().where(JobCodeRow.sha256 == CodePackageRow.sha256)
        gone = []
        with self._lock:
            with self.sessions() as s:
                due = s.scalars(
                    select(CodePackageRow.sha256).where(CodePackageRow.last_used_at < cutoff, unreferenced)
                ).all()
            for sha256 in due:
                with self.sessions.begin() as s:
                    deleted = s.execute(
                        delete(CodePackageRow).where(
                            CodePackageRow.sha256 == sha256, CodePackageRow.last_used_at < cutoff, unreferenced
                        ),
                        execution_options={"synchronize_session": False},
                    ).rowcount
                if deleted:
                    storage.delete_file(self.uri(sha256))
                    gone.append(sha256)
        if gone:
            log.info("deleted %d code package(s) no job references: %s", len(gone), ", ".join(g[:12] for g in gone))
        return gone


def _biggest(infos: list[zipfile.ZipInfo]) -> str:
    return biggest_files(heapq.nlargest(3, ((i.file_size, i.filename) for i in infos)))


def check_zip(path: Path, settings: Settings) -> tuple[int, int]:
    """Files and uncompressed bytes of a package, once it is known safe to unpack: a
    zip whose every entry is a plain file under ``code/`` (no absolute path, no ``..``,
    no link, no duplicate), within the file cap, whose declared sizes sum within the
    byte cap, and whose every entry inflates to exactly its declared size with the
    right CRC (a zip bomb that lies about its sizes is caught while reading)."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > settings.code_max_files:
                raise CodeTooLarge(
                    f"The package holds {len(infos)} files, more than {settings.code_max_files} "
                    f"(RAYDOCK_CODE_MAX_FILES); the biggest: {_biggest(infos)}. Leave out what the job does not need.",
                    status=422,
                    details=[{"cap": "max_files"}],
                )
            seen: set[str] = set()
            for info in infos:
                _check_entry(info, seen)
            declared = sum(i.file_size for i in infos)
            if declared > settings.code_max_bytes:
                raise CodeTooLarge(
                    f"The package unpacks to {declared} bytes, more than {settings.code_max_bytes} (RAYDOCK_CODE_MAX_BYTES); "
                    f"the biggest files: {_biggest(infos)}. Leave out what the job does not need.",
                    details=[{"cap": "max_bytes"}],
                )
            for info in infos:
                # zipfile stops at the declared size and then checks the CRC: a member
                # that would inflate past what it declares fails here, never fills a disk.
                inflated = 0
                try:
                    with zf.open(info) as member:
                        while chunk := member.read(READ_CHUNK):
                            inflated += len(chunk)
                except zipfile.BadZipFile as exc:
                    raise _unsafe(
                        info.filename, f"does not inflate to the {info.file_size} bytes it declares ({exc})"
                    ) from exc
                if inflated != info.file_size:
                    raise _unsafe(info.filename, f"inflates to {inflated} bytes, not the {info.file_size} it declares")
            return len(infos), declared
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as exc:
        raise InvalidSpec(
            f"The upload is not a usable zip ({exc}). Package the directory with `raydock submit` or Client.upload_code.",
            code="code_package_invalid",
        ) from exc


def _check_entry(info: zipfile.ZipInfo, seen: set[str]) -> None:
    name = info.filename
    parts = PurePosixPath(name).parts
    if "\\" in name or "\x00" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(name, "is an absolute or non-POSIX path")
    if ".." in parts or "." in parts or "" in name.split("/"):
        raise _unsafe(name, "climbs out of the package or has an empty step")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise _unsafe(name, "is a symbolic link")
    if info.is_dir():
        raise _unsafe(name, "is a directory entry (a package holds files only)")
    if len(parts) < 2 or parts[0] != TOP:
        raise _unsafe(name, f"is not under {TOP}/")
    if name in seen:
        raise _unsafe(name, "appears twice")
    seen.add(name)


def _unsafe(name: str, why: str) -> InvalidSpec:
    return InvalidSpec(
        f"The package entry {name[:300]!r} {why}; nothing was stored. Package the directory with `raydock submit` "
        "or Client.upload_code.",
        code="code_package_unsafe",
        details=[{"entry": name[:300], "msg": why}],
    )


def _too_large_body(size: int, cap: int) -> CodeTooLarge:
    return CodeTooLarge(
        f"The package is {size}+ bytes, more than {cap} (RAYDOCK_CODE_MAX_BYTES). Leave out what the job does not "
        "need (a .gitignore or .rayignore file, runtime_env.excludes), or ask the operator to raise the cap.",
        details=[{"cap": "max_bytes"}],
    )


def _not_found(sha256: str) -> NotFound:
    return NotFound(f"No code package {sha256}. Upload it with PUT /v1/code/{sha256}.", code="code_package_not_found")


def _public(row: CodePackageRow, jobs: int) -> CodePackagePublic:
    return CodePackagePublic(
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        files=row.files,
        content_bytes=row.content_bytes,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        jobs=jobs,
    )
