"""A job's code as a package: a deterministic zip of a local directory, named by its
sha256, built by the SDK and CLI and checked again by the server.

The same directory always gives the same bytes (entries sorted, fixed timestamps and
modes), so the hash says whether the server has the code already and an unchanged
directory is never uploaded twice. What is left out: ``.gitignore`` / ``.rayignore``
patterns found in the tree, the spec's ``runtime_env.excludes``, ``DEFAULT_EXCLUDES``,
and data files (``DATA_SUFFIXES``) over ``DATA_FILE_THRESHOLD``.

Every entry sits under one top-level directory, ``code/``: Ray unpacks a zip URI by
dropping a single top-level directory, so the job's working directory is exactly the
packaged directory whatever it holds. Links to files inside the directory are stored as
the files they point to; links to files outside it are left out with a warning (a link
to ``~/.aws/credentials`` must not ship the credentials); links to directories are not
followed. The package holds no directory
entries, no links, and nothing outside ``code/``, which is what the server checks.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import stat
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pathspec

from api.errors import CodeTooLarge, InvalidSpec
from api.schemas.code import CODE_REF_PREFIX

TOP = "code"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
)
DATA_SUFFIXES = frozenset(
    ".csv .tsv .parquet .arrow .feather .jsonl .npy .npz .pt .pth .ckpt .safetensors .bin .h5 .hdf5 "
    ".pkl .pickle .joblib .onnx .tfrecord .tar .tgz .gz .zip .bz2 .xz .7z .png .jpg .jpeg .wav .mp4".split()
)
DATA_FILE_THRESHOLD = 10 * 2**20
IGNORE_FILES = (".gitignore", ".rayignore")
# Top-level names a package may not define: raydock's drivers and Ray's workers import
# raydock's packages of these names before a job's code can be told apart (trainers/own_imports.py).
RESERVED_NAMES = ("trainers", "tuning")
CHUNK = 1 << 20


@dataclass
class Package:
    """A built package: the zip in a temp file (``discard`` removes it) and its facts."""

    path: Path
    sha256: str
    size: int  # bytes of the zip
    files: int
    content_bytes: int  # bytes of the files, uncompressed
    left_out: list[tuple[str, int]] = field(default_factory=list)  # data files over the threshold

    @property
    def ref(self) -> str:
        return CODE_REF_PREFIX + self.sha256

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class BiggestFiles:
    """The few biggest files seen, so a refusal over a cap can say what to leave out."""

    def __init__(self, keep: int = 3):
        self.keep = keep
        self._heap: list[tuple[int, str]] = []

    def add(self, size: int, path: str) -> None:
        heapq.heappush(self._heap, (size, path))
        if len(self._heap) > self.keep:
            heapq.heappop(self._heap)

    def largest(self) -> list[tuple[int, str]]:
        return sorted(self._heap, reverse=True)

    def text(self) -> str:
        return biggest_files(self.largest())


class _Caps:
    """Files and bytes against the caps; the biggest files seen, for the message."""

    def __init__(self, max_bytes: int, max_files: int, root: Path):
        self.max_bytes, self.max_files, self.root = max_bytes, max_files, root
        self.files = self.bytes = 0
        self.biggest = BiggestFiles()

    def add(self, rel: str, size: int) -> None:
        self.files += 1
        self.bytes += size
        self.biggest.add(size, rel)
        if self.files > self.max_files:
            self._refuse(f"more than {self.max_files} files (RAYDOCK_CODE_MAX_FILES)", "max_files")
        if self.bytes > self.max_bytes:
            self._refuse(f"more than {self.max_bytes} bytes (RAYDOCK_CODE_MAX_BYTES)", "max_bytes")

    def _refuse(self, over: str, cap: str) -> None:
        raise CodeTooLarge(
            f"The code in {self.root} holds {over}; the biggest files: {self.biggest.text()}. Leave out what "
            "the job does not need (a .gitignore or .rayignore file, runtime_env.excludes), or ask the operator to "
            "raise the cap.",
            details=[{"cap": cap, "biggest": [{"path": p, "bytes": n} for n, p in self.biggest.largest()]}],
        )


def biggest_files(biggest: list[tuple[int, str]]) -> str:
    """``path (size), ...`` biggest first."""
    return ", ".join(f"{p} ({file_size(n)})" for n, p in sorted(biggest, reverse=True)) or "none"


def file_size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def package_files(
    root: Path, excludes: list[str] | None = None, *, threshold: int = DATA_FILE_THRESHOLD
) -> tuple[list[tuple[str, Path]], list[tuple[str, int]]]:
    """The files a package of ``root`` holds, as sorted ``(name in the zip, path)``, and
    the data files left out for their size."""
    chosen: list[tuple[str, Path]] = []
    left_out: list[tuple[str, int]] = []
    outside: list[str] = []
    real_root = Path(os.path.realpath(root))
    top_rules = pathspec.PathSpec.from_lines("gitignore", [*DEFAULT_EXCLUDES, *(excludes or [])])
    rules: dict[str, list[tuple[str, pathspec.PathSpec]]] = {"": [("", top_rules)]}
    for current, dirs, files in os.walk(root, followlinks=False):
        rel_dir = Path(current).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        here = list(rules[rel_dir])
        for name in IGNORE_FILES:
            if os.path.isfile(os.path.join(current, name)):
                with open(os.path.join(current, name), errors="replace") as f:
                    here.append((rel_dir, pathspec.PathSpec.from_lines("gitignore", f.read().splitlines())))

        def ignored(rel: str, is_dir: bool) -> bool:
            for base, spec in here:
                sub = rel[len(base) + 1 :] if base else rel
                if spec.match_file(sub + "/" if is_dir else sub):
                    return True
            return False

        kept = []
        for d in sorted(dirs):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if not os.path.islink(os.path.join(current, d)) and not ignored(rel, True):
                kept.append(d)
                rules[rel] = here
        dirs[:] = kept
        for name in files:
            rel, path = (f"{rel_dir}/{name}" if rel_dir else name), Path(current, name)
            if ignored(rel, False) or not path.is_file():  # a dangling link, a socket, a link to a directory
                continue
            if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(real_root):
                outside.append(rel)  # e.g. a link to ~/.aws/credentials: its target is not the project's to ship
                continue
            size = path.stat().st_size
            if size > threshold and path.suffix.lower() in DATA_SUFFIXES:
                left_out.append((rel, size))
                continue
            chosen.append((rel, path))
    if outside:
        warnings.warn(
            f"Left out of the code package: {len(outside)} symlink(s) to files outside {root} "
            f"({', '.join(sorted(outside)[:5])}). Copy a file into the directory if the job needs it.",
            stacklevel=2,
        )
    return sorted(chosen), sorted(left_out)


def build_package(
    root: str | os.PathLike,
    excludes: list[str] | None = None,
    *,
    max_bytes: int,
    max_files: int,
    threshold: int = DATA_FILE_THRESHOLD,
    progress: Callable[[str, int, int], None] | None = None,
) -> Package:
    """Zip ``root`` deterministically into a temp file; ``CodeTooLarge`` past a cap.
    ``progress(phase, done, total)`` is called with phase ``files`` while packing."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise InvalidSpec(
            f"working_dir {str(root)!r} is not a directory on this machine. Give the directory of your code "
            "(relative to the spec file, or absolute).",
            code="working_dir_not_found",
            details=[{"loc": ["working_dir"], "msg": "not a directory"}],
        )
    files, left_out = package_files(root, excludes, threshold=threshold)
    caps = _Caps(max_bytes, max_files, root)
    sizes = []
    for rel, path in files:
        size = path.stat().st_size
        caps.add(rel, size)
        sizes.append(size)
    fd, tmp = tempfile.mkstemp(prefix="raydock-code-", suffix=".zip")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for i, ((rel, path), size) in enumerate(zip(files, sizes)):
                info = zipfile.ZipInfo(f"{TOP}/{rel}", date_time=FIXED_TIME)
                info.create_system = 3  # unix: the mode below is read from external_attr
                mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
                info.external_attr = (stat.S_IFREG | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                info.file_size = size
                with open(path, "rb") as src, zf.open(info, "w", force_zip64=size > 2**31) as dst:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                if progress is not None:
                    progress("files", i + 1, len(files))
        digest = file_sha256(Path(tmp))
    except BaseException:
        os.unlink(tmp)
        raise
    return Package(Path(tmp), digest, os.path.getsize(tmp), len(files), caps.bytes, left_out)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def module_in_package(module: str, names: set[str]) -> bool:
    """Whether the dotted ``module`` is importable from a package whose files are
    ``names`` (paths under ``code/``): a module file, or a package directory."""
    path = "/".join([TOP, *module.split(".")])
    if f"{path}.py" in names or f"{path}/__init__.py" in names:
        return True
    # Extension modules, and namespace packages (a directory with no __init__.py).
    return any(n.startswith(f"{path}.") and n.endswith((".so", ".pyd")) or n.startswith(f"{path}/") for n in names)


def reserved_names(names: set[str]) -> list[str]:
    """The reserved top-level names a package's files define."""
    tops = {n.split("/")[1].removesuffix(".py") for n in names if n.count("/") >= 1}
    return sorted(tops & set(RESERVED_NAMES))
