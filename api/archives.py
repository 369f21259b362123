"""Unpacking a checkpoint archive the server sent, safely on every Python the SDK supports.

``tarfile``'s ``data`` filter (Python 3.10.12+, 3.11.4+, 3.12) refuses members that would
land outside the target, links out of it, device files, and strips setuid bits; on an
older 3.10 ``extractall`` has no ``filter`` and unpacks whatever the archive says. There
every member is checked here first, against the same rules: a plain file or directory,
a relative path that stays in the target, no link of any kind, and a mode of at most 0755.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from api.errors import RaydockError


def extract(tar: tarfile.TarFile, target: Path) -> None:
    """Unpack ``tar`` into ``target``, refusing (``RaydockError`` ``archive_unsafe``) a
    member that would write outside it or be anything but a file or directory."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(target, filter="data")
        except tarfile.FilterError as exc:
            raise _unsafe(exc.tarinfo.name, f"was refused by tarfile's data filter ({exc})") from None
    else:  # Python 3.10.0-3.10.11
        tar.extractall(target, members=checked_members(tar, target))


def checked_members(tar: tarfile.TarFile, target: Path) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, each checked as the ``data`` filter would, modes clamped to 0755."""
    root = Path(os.path.realpath(target))
    members = []
    for member in tar.getmembers():
        name = member.name
        if not (member.isfile() or member.isdir()):
            raise _unsafe(name, "is a link or a special file")
        if name.startswith("/") or os.path.isabs(name) or ".." in Path(name).parts:
            raise _unsafe(name, "is an absolute path or climbs out of the checkpoint")
        if not Path(os.path.realpath(root / name)).is_relative_to(root):
            raise _unsafe(name, "would be written outside the checkpoint directory")
        member.mode = member.mode & 0o755 if member.mode is not None else None
        members.append(member)
    return members


def _unsafe(name: str, why: str) -> RaydockError:
    return RaydockError(
        f"The checkpoint archive's member {name[:300]!r} {why}; nothing more was unpacked. The server sent an archive "
        "raydock does not make: tell its operator.",
        code="archive_unsafe",
    )
