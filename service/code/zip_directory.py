"""A zip's central directory measured before anything parses it.

``zipfile.ZipFile`` builds a ``ZipInfo`` object for every central-directory record as it
opens a file, whatever count the end record claims: a 94 MiB upload of minimal records
is 1.9 million objects (+833 MiB) before a file cap can be checked. So an upload's end
record (zip64 included) is read first, with the same lookup ``ZipFile`` makes, and the
directory is refused by its size and its claimed count; the records are then counted by
walking their fixed headers in the bytes, with no object per record, and refused past
the cap. Only a directory within both caps is handed to ``ZipFile``.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

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
