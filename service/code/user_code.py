"""What user code a job may bring to the cluster: the policy checked at submit.

A job's ``working_dir`` and ``runtime_env.py_modules`` name paths on the *server*; Ray
zips them there and ships them with the job. So they must lie under a code root the
operator chose (``RAYDOCK_CODE_ROOT``, symlinks and ``..`` resolved), and so must every
symlink inside them (Ray follows links when it zips). The tree is walked the way Ray
walks it (``.gitignore``, ``.rayignore`` and ``excludes`` honoured) and the walk stops at
the size and file-count caps, so a request never hashes a whole disk.

``runtime_env`` keys are allowlisted; its packages and environment variables are checked
by service/code/package_policy.py (no installer options, no index or loader variables). The entrypoint module is located by
path search alone, without importing any package: ``this.nothing`` must not run
``this``.

Error codes (all 422): ``runtime_env_key_not_allowed``, ``runtime_env_invalid``,
``env_var_not_allowed``, ``code_root_not_configured``, ``working_dir_not_found``,
``py_module_not_found``, ``code_link_outside_root``, ``code_too_large``,
``entrypoint_not_found``.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
from pathlib import Path
from typing import Any, Callable

import pathspec

from api.code_package import BiggestFiles
from api.errors import InvalidSpec
from api.schemas import JobSpec, code_spec
from service.code.package_policy import MAX_LIST, PACKAGE_KEYS, check_env_vars, check_packages, str_list
from service.settings import Settings

ALLOWED_KEYS = {
    "pip": "packages installed on the cluster (a list of requirement strings)",
    "uv": "packages installed with uv (a list of requirement strings)",
    "env_vars": "environment variables for the job's processes",
    "excludes": "patterns left out of working_dir and py_modules",
    "py_modules": "more code: directories under the code root, or s3:// gs:// https:// archives",
    "config": "setup_timeout_seconds and eager_install",
}
REMOTE_SCHEMES = ("s3://", "gs://", "https://")
UPLOAD_HINT = (
    "To run code from your machine, upload it: `raydock submit` and Client.submit package a local working_dir "
    "and send `code: sha256:...` (PUT /v1/code/{sha256})."
)
MAX_PY_MODULES = 50
LOADERS = (
    (ExtensionFileLoader, EXTENSION_SUFFIXES),
    (SourceFileLoader, SOURCE_SUFFIXES),
    (SourcelessFileLoader, BYTECODE_SUFFIXES),
)


def check_user_code(spec: JobSpec, settings: Settings) -> None:
    """Refuse (``InvalidSpec``, 422) a user-code job whose code or environment breaks the
    policy. Server paths are pinned in the spec as they were checked: ``working_dir``
    and local ``py_modules`` become absolute, resolved paths under the code root."""
    train = code_spec(spec)
    if not train.is_user_code:
        return
    at = ["base"] if spec.kind == "tune" else []
    env = train.runtime_env or {}
    _check_keys(env, at, settings)
    budget = _Budget(settings)  # the caps count working_dir and py_modules together
    if train.working_dir:
        train.working_dir = str(_check_tree(train.working_dir, at + ["working_dir"], env, settings, budget))
    modules = [_check_py_module(m, i, at, env, settings, budget) for i, m in enumerate(env.get("py_modules") or [])]
    if modules:
        env["py_modules"] = modules
    if not train.code:  # an uploaded package's entrypoint is looked up in the package (service/code/packages.py)
        _check_entrypoint(train.entrypoint, train.working_dir, modules, env, at)


# ---------------------------------------------------------------- runtime_env


def _refuse(message: str, code: str, loc: list, msg: str) -> InvalidSpec:
    return InvalidSpec(message, code=code, details=[{"loc": loc, "msg": msg}])


def _check_keys(env: dict[str, Any], at: list, settings: Settings) -> None:
    for key, value in env.items():
        loc = at + ["runtime_env", key]
        if key not in ALLOWED_KEYS:
            allowed = "; ".join(f"{k} ({what})" for k, what in ALLOWED_KEYS.items())
            hint = " Give the directory as the job's top-level `working_dir`." if key == "working_dir" else ""
            raise _refuse(
                f"runtime_env.{key} is not allowed on this server.{hint} Allowed runtime_env keys: {allowed}.",
                "runtime_env_key_not_allowed",
                loc,
                "key not allowed",
            )
        if key == "env_vars":
            check_env_vars(value, loc)
        elif key in PACKAGE_KEYS:
            check_packages(key, value, loc, settings.code.pip_allowed_hosts)
        elif key in ("excludes", "py_modules"):
            most = MAX_PY_MODULES if key == "py_modules" else MAX_LIST
            if not str_list(value) or len(value) > most:
                raise _refuse(
                    f"runtime_env.{key} must be a list of at most {most} strings.",
                    "runtime_env_invalid",
                    loc,
                    "not a list of strings",
                )
        elif key == "config":
            ok = isinstance(value, dict) and set(value) <= {"setup_timeout_seconds", "eager_install"}
            if (
                not ok
                or not isinstance(value.get("setup_timeout_seconds", 1), int)
                or not isinstance(value.get("eager_install", True), bool)
            ):
                raise _refuse(
                    "runtime_env.config may hold setup_timeout_seconds (an int) and eager_install (a bool) only.",
                    "runtime_env_invalid",
                    loc,
                    "unknown or mistyped config",
                )


# ---------------------------------------------------------------- server paths


def _resolve(raw: str, field: str, loc: list, settings: Settings) -> Path:
    """The real path ``raw`` names, which must lie under a code root. A path outside
    the roots gets the same answer whether or not it exists (no probing the server's
    disk); ``~`` means the server's home, which is outside unless a root holds it."""
    roots = settings.code.code_roots
    if not roots:
        raise _refuse(
            f"{field} {raw!r} names a path on the server, and this server ships no code from its disk "
            f"(RAYDOCK_CODE_ROOT is not set). {UPLOAD_HINT} Or ask the operator to set RAYDOCK_CODE_ROOT to the "
            "directory your code is in, or ship it as an s3:// gs:// https:// archive in runtime_env.py_modules.",
            "code_root_not_configured",
            loc,
            "no code root",
        )
    path = Path(os.path.expanduser(raw))
    real = Path(os.path.realpath(path if path.is_absolute() else roots[0] / path))
    if not _under(real, roots):
        where = ", ".join(map(str, roots))
        raise _refuse(
            f"{field} {raw!r} is not under the server's code root ({where}). {UPLOAD_HINT} Or put the code "
            "there (or give a path relative to it).",
            "working_dir_not_found" if field == "working_dir" else "py_module_not_found",
            loc,
            "outside the code root",
        )
    return real


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _check_tree(raw: str, loc: list, env: dict[str, Any], settings: Settings, budget: "_Budget") -> Path:
    real = _resolve(raw, "working_dir", loc, settings)
    if not real.is_dir():
        raise _refuse(
            f"working_dir {raw!r} is not a directory on the server. Give a directory under the code root.",
            "working_dir_not_found",
            loc,
            "not a directory",
        )
    _walk(real, env.get("excludes") or [], "working_dir", loc, settings, budget)
    return real


def _check_py_module(raw: str, i: int, at: list, env: dict[str, Any], settings: Settings, budget: "_Budget") -> str:
    if raw.startswith(REMOTE_SCHEMES):
        return raw  # fetched by the cluster, never read by the server
    loc = at + ["runtime_env", "py_modules", i]
    if "://" in raw:
        raise _refuse(
            f"runtime_env.py_modules entry {raw[:200]!r}: give a directory under the code root or an "
            f"{' '.join(REMOTE_SCHEMES)} URI.",
            "py_module_not_found",
            loc,
            "unsupported URI",
        )
    real = _resolve(raw, "runtime_env.py_modules entry", loc, settings)
    if real.is_dir():
        _walk(real, env.get("excludes") or [], "runtime_env.py_modules entry", loc, settings, budget)
    elif real.is_file() and real.suffix == ".whl":
        _walk(real, [], "runtime_env.py_modules entry", loc, settings, budget)
    else:
        raise _refuse(
            f"runtime_env.py_modules entry {raw!r} is not a directory or .whl file on the server.",
            "py_module_not_found",
            loc,
            "not found",
        )
    return str(real)


class _Budget:
    """Files, directories and bytes a job ships, against the caps; the biggest files seen."""

    def __init__(self, settings: Settings):
        self.max_entries, self.max_bytes = settings.code.code_max_files, settings.code.code_max_bytes
        self.entries = self.size = 0
        self.biggest = BiggestFiles()

    def add(self, path: Path, size: int | None) -> str | None:
        """Count one entry (``size`` None: a directory); what cap it broke, if any."""
        self.entries += 1
        if size is not None:
            self.size += size
            self.biggest.add(size, str(path))
        if self.entries > self.max_entries:
            return f"more than {self.max_entries} files and directories (RAYDOCK_CODE_MAX_FILES)"
        if self.size > self.max_bytes:
            return f"more than {self.max_bytes / 2**20:.0f} MiB (RAYDOCK_CODE_MAX_BYTES)"
        return None


def _walk(top: Path, excludes: list[str], field: str, loc: list, settings: Settings, budget: _Budget) -> None:
    """Walk ``top`` as Ray does when it zips it (ray/_private/runtime_env/packaging.py
    ``_dir_travel``: ignore files, and ``excludes`` relative to ``top``; links
    followed), stopping at the caps. What the patterns leave out goes unchecked, so they
    are read by the engine Ray reads them with: pathspec's gitignore patterns (the SDK
    packs with the same library). The one reading Ray's copy of pathspec does not share,
    an escaped space at a pattern's end, is refused rather than guessed."""

    def matcher(rel_to: Path, lines: list[str], where: str) -> Callable[[Path], bool]:
        if bad := next((line for line in lines if line.rstrip("\r\n").endswith("\\ ")), None):
            raise _refuse(
                f"The pattern {bad!r} in {where} ends in an escaped space, which Ray and git read differently; "
                "remove the trailing backslash and space, or name the file another way.",
                "ambiguous_ignore_pattern",
                loc,
                "an escaped trailing space",
            )
        spec = pathspec.PathSpec.from_lines("gitignore", lines)
        return lambda p: spec.match_file(p.relative_to(rel_to).as_posix())

    def ignore_files(d: Path) -> list[Callable[[Path], bool]]:
        names = (
            (".gitignore", ".rayignore")
            if os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
            else (".rayignore",)
        )
        return [
            matcher(d, (d / n).read_text(errors="replace").splitlines(), str(d / n)) for n in names if (d / n).is_file()
        ]

    roots = settings.code.code_roots
    stack: list[tuple[Path, tuple]] = [
        (top, (matcher(top, excludes, "runtime_env.excludes"),) if excludes and top.is_dir() else ())
    ]
    while stack:
        path, inherited = stack.pop()
        is_dir = path.is_dir()
        rules = inherited + tuple(ignore_files(path)) if is_dir else inherited
        if any(rule(path) for rule in rules):  # top too, as "." (a bare `*` leaves out everything)
            continue
        if path.is_symlink() and not _under(Path(os.path.realpath(path)), roots):
            raise _refuse(
                f"{field} {str(top)!r} holds a symlink, {path.relative_to(top.parent)}, to a path outside the code "
                "root; Ray would ship what it points to. Remove the link or exclude it (runtime_env.excludes).",
                "code_link_outside_root",
                loc,
                "symlink outside the code root",
            )
        if is_dir:
            stack.extend((child, rules) for child in path.iterdir())
        size = path.stat().st_size if not is_dir and path.is_file() else None
        if over := budget.add(path.relative_to(top.parent), size):
            raise _refuse(
                f"The job's code ({field} {str(top)!r} and any other paths it ships) holds {over}; the biggest files "
                f"seen: {budget.biggest.text()}. Leave out what the job does not need (runtime_env.excludes, a "
                ".rayignore file), or ask the operator to raise the cap.",
                "code_too_large",
                loc,
                "over the cap",
            )


# ---------------------------------------------------------------- entrypoint


def _check_entrypoint(
    entrypoint: str, working_dir: str | None, modules: list[str], env: dict[str, Any], at: list
) -> None:
    module = entrypoint.split(":")[0]
    top = module.split(".")[0]
    local = [m for m in modules if not m.startswith(REMOTE_SCHEMES)]
    # A py_module directory named like the top package is importable by that name on the cluster.
    shipped = [str(Path(m).parent) for m in local if Path(m).name == top]
    search = ([working_dir] if working_dir else []) + shipped + [p or os.getcwd() for p in sys.path]
    if locate(module, search):
        return
    # Code from packages or archives only the cluster sees cannot be looked at here;
    # the driver reports a missing module as a USER_CODE failure.
    if env.get("pip") or env.get("uv") or len(local) < len(modules) or any(m.endswith(".whl") for m in local):
        return
    where = f"in working_dir {working_dir!r} or" if working_dir else ""
    raise _refuse(
        f"entrypoint module {module!r} was not found {where} on the server's Python path. "
        "Check the module path in `entrypoint`, or set `working_dir` to the directory that contains it.",
        "entrypoint_not_found",
        at + ["entrypoint"],
        "module not found",
    )


def locate(module: str, search: list[str]) -> bool:
    """Whether ``module`` (dotted) is importable from ``search``, found by looking at
    files only: each package's ``submodule_search_locations`` leads to the next part,
    and no ``__init__`` runs. The last part must be a module or a regular package."""
    parts = module.split(".")
    locations = search
    for i in range(len(parts)):
        found = _find(".".join(parts[: i + 1]), locations)
        if found is None:
            return False
        has_code, locations = found
        if i == len(parts) - 1:
            return has_code
        if not locations:
            return False  # a plain module has no submodules
    return False


def _find(fullname: str, locations: list[str]) -> tuple[bool, list[str]] | None:
    """(has a loader, submodule locations) of ``fullname`` in ``locations``; namespace
    portions are merged as the import system does. Finders are made here, not taken
    from ``sys.path_importer_cache``, so the server's own import state is untouched."""
    portions: list[str] = []
    for location in locations:
        if not os.path.isdir(location):
            continue
        spec = FileFinder(location, *LOADERS).find_spec(fullname)
        if spec is None:
            continue
        if spec.loader is not None:
            return True, list(spec.submodule_search_locations or [])
        portions.extend(spec.submodule_search_locations or [])
    return (False, portions) if portions else None
