"""What an uploaded package must be to be stored: its central directory measured before
anything parses it (``check_directory``), then every entry a plain file under ``code/``
that inflates to exactly what it declares (``check_zip``).

``zipfile.ZipFile`` builds a ``ZipInfo`` object for every central-directory record as it
opens a file, whatever count the end record claims: a 94 MiB upload of minimal records
is 1.9 million objects (+833 MiB) before a file cap can be checked. So an upload's end
record (zip64 included) is read first, with the same lookup ``ZipFile`` makes, and the
directory is refused by its size and its claimed count; the records are then counted by
walking their fixed headers in the bytes, with no object per record, and refused past
the cap. Only a directory within both caps is handed to ``ZipFile``.
"""

from __future__ import annotations

import heapq
import stat
import struct
import zipfile
from pathlib import Path

from api.code_package import TOP, biggest_files
from api.errors import CodeTooLarge, InvalidSpec
from service.settings import Settings

CENTRAL_HEADER = struct.Struct("<4s24xHHH12x")  # signature; name, extra and comment lengths at 28, 30, 32
CENTRAL_SIGNATURE = b"PK\x01\x02"
# A record is 46 bytes and its name, extra field and comment; a code file's path is far shorter.
MAX_RECORD_BYTES = 46 + 1024
ZIP64_TRAILER = 56 + 20  # the zip64 end record and its locator, between the directory and the end record


class DirectoryTooLarge(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def check_directory(path: Path, max_entries: int) -> int:
    """The number of central-directory records of the zip at ``path``; raises
    ``DirectoryTooLarge`` past ``max_entries`` records (claimed or counted) or past the
    bytes that many records can take, and ``zipfile.BadZipFile`` for no end record."""
    with open(path, "rb") as f:
        # The end-record lookup ZipFile itself makes (the record, or the zip64 one it points to).
        end = zipfile._EndRecData(f)  # noqa: SLF001 - the stdlib's own reader, so both agree on the directory
        if end is None:
            raise zipfile.BadZipFile("no end of central directory record: not a zip, or cut short")
        claimed, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # noqa: SLF001
        if claimed > max_entries:
            raise DirectoryTooLarge(f"its directory claims {claimed} entries")
        if size > max_entries * MAX_RECORD_BYTES:
            raise DirectoryTooLarge(f"its directory is {size} bytes, more than {max_entries} entries take")
        # Where ZipFile will read the directory from: just before the end record(s).
        start = end[zipfile._ECD_LOCATION] - size  # noqa: SLF001
        if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:  # noqa: SLF001
            start -= ZIP64_TRAILER
        if start < 0:
            raise zipfile.BadZipFile("the central directory starts before the file")
        f.seek(start)
        directory = f.read(size)
    records, at = 0, 0
    while at + CENTRAL_HEADER.size <= len(directory):
        signature, name, extra, comment = CENTRAL_HEADER.unpack_from(directory, at)
        if signature != CENTRAL_SIGNATURE:
            break  # ZipFile reports the bad record when it parses
        records += 1
        if records > max_entries:
            raise DirectoryTooLarge(f"its directory holds more than {max_entries} entries")
        at += CENTRAL_HEADER.size + name + extra + comment
    return records


ALLOWED_MODE = 0o755  # permission bits an entry may carry: no setuid/setgid/sticky, no group or world write
READ_CHUNK = 1 << 20


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
            check_directory(path, settings.code.code_max_files)  # before ZipFile makes an object per record
        except DirectoryTooLarge as exc:
            raise CodeTooLarge(
                f"The package holds more than {settings.code.code_max_files} files (RAYDOCK_CODE_MAX_FILES): {exc.what}. "
                "Leave out what the job does not need.",
                status=422,
                details=[{"cap": "max_files"}],
            ) from None
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > settings.code.code_max_files:
                raise CodeTooLarge(
                    f"The package holds {len(infos)} files, more than {settings.code.code_max_files} "
                    f"(RAYDOCK_CODE_MAX_FILES); the biggest: {_biggest(infos)}. Leave out what the job does not need.",
                    status=422,
                    details=[{"cap": "max_files"}],
                )
            seen: set[str] = set()
            for info in infos:
                _check_entry(info, seen)
            declared = sum(i.file_size for i in infos)
            if declared > settings.code.code_max_bytes:
                raise CodeTooLarge(
                    f"The package unpacks to {declared} bytes, more than {settings.code.code_max_bytes} (RAYDOCK_CODE_MAX_BYTES); "
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
