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
(404 on the code routes, 422 in a job spec), ``code_package_altered`` (409: the stored bytes no longer match
the name; checked on every use, and at every attempt's start by service/attempts.py), ``too_many_uploads``
(429 with Retry-After, past ``RAYDOCK_MAX_CONCURRENT_UPLOADS`` uploads at once).
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
from pathlib import Path
from typing import AsyncIterator

from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.code_package import TOP, biggest_files, module_in_package, reserved_names
from api.errors import CodeTooLarge, Conflict, InvalidSpec, NotFound, RaydockError
from api.schemas import CODE_REF_PREFIX, CodeLimits, CodePackagePublic
from service import storage
from service.code.zip_directory import DirectoryTooLarge, check_directory
from service.db.models import CodePackageRow, JobCodeRow, count, utcnow
from service.settings import Settings

log = logging.getLogger("raydock.code")

CODE_DIR = "_code"  # under the storage path, beside the jobs' prefixes (job ids start with "j")
READ_CHUNK = 1 << 20
ALLOWED_MODE = 0o755  # permission bits an entry may carry: no setuid/setgid/sticky, no group or world write


class TooManyUploads(RaydockError):
    """More uploads at once than the server takes in (each holds a temp file, a hash and a zip check)."""

    status, code = 429, "too_many_uploads"
    retry_after_s = 5


@dataclass(frozen=True)
class Stored:
    package: CodePackagePublic
    created: bool  # False: the server had it already


class CodeStore:
    def __init__(self, settings: Settings, sessions: sessionmaker):
        self.settings, self.sessions = settings, sessions
        self.incoming = settings.data_dir / "code-incoming"
        self._lock = threading.Lock()  # a store and a collection of the same package never interleave here
        self._uploads = 0  # uploads being received now, against RAYDOCK_MAX_CONCURRENT_UPLOADS

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

    def get(self, sha256: str, *, check: bool = False) -> CodePackagePublic:
        """The package's record; ``check``: only if its stored bytes still match its name."""
        with self.sessions() as s:
            row = s.get(CodePackageRow, sha256)
            if row is None:
                raise _not_found(sha256)
            public = _public(row, count(s, JobCodeRow, JobCodeRow.sha256 == sha256))
        if check and not self.verify(sha256):
            raise altered(sha256)
        return public

    # ------------------------------------------------------------------ upload

    async def receive(self, sha256: str, declared: int | None, body: AsyncIterator[bytes]) -> Stored:
        """Take an upload: counted and hashed as it arrives, checked, then stored."""
        cap = self.settings.code_max_bytes
        if declared is not None and declared > cap:
            raise _too_large_body(declared, cap)
        if self._uploads >= self.settings.max_concurrent_uploads:
            raise TooManyUploads(
                f"The server is taking in {self._uploads} code uploads already (RAYDOCK_MAX_CONCURRENT_UPLOADS); "
                f"nothing was read. Upload again in {TooManyUploads.retry_after_s} s.",
                details=[{"cap": "max_concurrent_uploads", "limit": self.settings.max_concurrent_uploads}],
            )
        self._uploads += 1  # on the event loop: no other receive runs between the test and this
        try:
            return await self._receive(sha256, body, cap)
        finally:
            self._uploads -= 1

    async def _receive(self, sha256: str, body: AsyncIterator[bytes], cap: int) -> Stored:
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
        """The package, with its retention restarted, if the server has it (row, and a file
        whose bytes still hash to its name: one rewritten in storage counts as missing,
        so the next upload of the real bytes replaces it)."""
        with self.sessions.begin() as s:
            row = s.get(CodePackageRow, sha256)
            if row is None or not self.verify(sha256):
                return None
            row.last_used_at = utcnow()
        return self.get(sha256)

    def verify(self, sha256: str) -> bool:
        """Whether the stored package's bytes still hash to its name. Jobs can reach the
        storage path, so a package is checked whenever it is about to be used; reading
        stops past the byte cap (a file grown in place is no package of ours)."""
        if not storage.exists(self.uri(sha256)):
            return False
        digest, size = hashlib.sha256(), 0
        with storage.open_random_access(self.uri(sha256)) as f:
            while chunk := f.read(READ_CHUNK):
                size += len(chunk)
                if size > self.settings.code_max_bytes:
                    break
                digest.update(chunk)
        if size <= self.settings.code_max_bytes and digest.hexdigest() == sha256:
            return True
        log.warning("code package %s no longer matches its hash in storage: it was changed after upload", sha256[:12])
        return False

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
        try:
            check_directory(path, settings.code_max_files)  # before ZipFile makes an object per record
        except DirectoryTooLarge as exc:
            raise CodeTooLarge(
                f"The package holds more than {settings.code_max_files} files (RAYDOCK_CODE_MAX_FILES): {exc.what}. "
                "Leave out what the job does not need.",
                status=422,
                details=[{"cap": "max_files"}],
            ) from None
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
    # The name's own segments: PurePosixPath would drop a "." (so `code/./x` would pass
    # the duplicate and reserved-name checks as a second name for `code/x`).
    parts = name.split("/")
    if "\\" in name or "\x00" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(name, "is an absolute or non-POSIX path")
    if ".." in parts or "." in parts or "" in parts[:-1]:
        raise _unsafe(name, "climbs out of the package or has a '.' or empty step")
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise _unsafe(name, "is a symbolic link")
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG) and not info.is_dir():
        raise _unsafe(name, "is not a regular file")
    if stat.S_IMODE(mode) & ~ALLOWED_MODE:
        # Ray's unzip restores the mode: a setuid bit or a world-writable file would survive it.
        raise _unsafe(name, f"has mode {stat.S_IMODE(mode):04o}; a package holds 0644 or 0755 files")
    if info.is_dir():
        raise _unsafe(name, "is a directory entry (a package holds files only)")
    if len(parts) < 2 or parts[0] != TOP or not parts[-1]:
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


def altered(sha256: str) -> Conflict:
    return Conflict(
        f"Code package {sha256} was changed in storage after it was uploaded: its bytes no longer hash to its "
        f"name, so the server will not use or describe it. Upload it again (PUT /v1/code/{sha256}; `raydock submit` "
        "and Client.submit do) and tell the operator: the storage path's _code/ directory is writable by someone.",
        code="code_package_altered",
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
