"""What a job may ask Ray's package installer for: ``runtime_env.pip`` / ``uv`` entries
and the environment variables it runs with.

Ray writes each pip entry as one line of a requirements file and runs the installer
with the job's ``env_vars``; it caches the environment it built by the package list
alone, so a later job asking for the same packages gets whatever the first one
installed. An entry must therefore be one requirement, nothing more: parsed by
``packaging`` (PEP 508), no control characters (a newline would start a second line:
``--index-url ...``, ``-r /any/file``), no installer option, and no direct reference
(``pkg @ https://...``) unless the operator allows its host
(``RAYDOCK_PIP_ALLOWED_HOSTS``). Variables that steer the installer or the loader
(``PIP_*``, ``UV_*``, ``PYTHON*``, ``LD_*``, ``CONDA_*``, proxies, CA bundles, ``HOME``,
...) are refused: they would pick the package index or the code that runs.

Error codes (422): ``runtime_env_invalid``, ``env_var_not_allowed``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from api.errors import InvalidSpec

RESERVED_ENV_PREFIXES = ("RAYDOCK_", "RAY_")
# The installer's and the loader's own settings: each picks where packages come from or which code runs.
INSTALLER_ENV_PREFIXES = ("PIP_", "UV_", "PYTHON", "LD_", "DYLD_", "CONDA", "VIRTUAL_ENV", "MAMBA", "PDM_", "POETRY_")
INSTALLER_ENV_NAMES = frozenset(
    "PATH HOME XDG_CONFIG_HOME XDG_CONFIG_DIRS XDG_CACHE_HOME XDG_DATA_HOME NETRC REQUESTS_CA_BUNDLE SSL_CERT_FILE "
    "SSL_CERT_DIR CURL_CA_BUNDLE HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY GIT_CONFIG_GLOBAL GIT_CONFIG_SYSTEM "
    "GIT_SSH_COMMAND GIT_ASKPASS".split()
)
# PYTHON* variables that change output or hashing only, and that jobs commonly set.
HARMLESS_ENV_NAMES = frozenset(
    "PYTHONUNBUFFERED PYTHONHASHSEED PYTHONFAULTHANDLER PYTHONDONTWRITEBYTECODE PYTHONIOENCODING PYTHONUTF8".split()
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
PACKAGE_KEYS = {"pip": {"packages", "pip_check", "pip_version"}, "uv": {"packages", "uv_check", "uv_version"}}
MAX_LIST = 1000


def refuse(message: str, code: str, loc: list, msg: str) -> InvalidSpec:
    return InvalidSpec(message, code=code, details=[{"loc": loc, "msg": msg}])


def check_env_vars(value: Any, loc: list) -> None:
    """Refuse a malformed ``env_vars`` mapping, or a variable the server, Ray or the installer reads."""
    if not isinstance(value, dict) or len(value) > MAX_LIST:
        raise refuse(
            f"runtime_env.env_vars must map names to strings (at most {MAX_LIST}).",
            "runtime_env_invalid",
            loc,
            "not a mapping",
        )
    for name, v in value.items():
        if not ENV_NAME_RE.match(name) or not isinstance(v, str):
            raise refuse(
                f"runtime_env.env_vars.{name!s:.200}: names are letters, digits and _ (not starting with a digit), values are strings.",
                "runtime_env_invalid",
                loc + [name],
                "bad name or value",
            )
        upper = name.upper()
        if upper.startswith(RESERVED_ENV_PREFIXES):
            raise refuse(
                f"runtime_env.env_vars.{name} is not allowed: RAYDOCK_* and RAY_* variables are set by the server "
                f"and by Ray. Rename the variable your code reads (e.g. MY_{name}).",
                "env_var_not_allowed",
                loc + [name],
                "reserved prefix",
            )
        if upper not in HARMLESS_ENV_NAMES and (
            upper in INSTALLER_ENV_NAMES or upper.startswith(INSTALLER_ENV_PREFIXES)
        ):
            raise refuse(
                f"runtime_env.env_vars.{name} is not allowed: Ray runs the package installer and the job's Python "
                "with these variables, so it would choose where packages come from or which code runs (and Ray "
                "reuses the installed environment for later jobs). The cluster's own installer configuration names "
                f"the package index; rename the variable your code reads (e.g. MY_{name}).",
                "env_var_not_allowed",
                loc + [name],
                "installer or loader variable",
            )


def check_packages(key: str, value: Any, loc: list, allowed_hosts: frozenset[str]) -> None:
    """Refuse a ``pip`` / ``uv`` field that is not a list of plain requirements."""
    packages = value.get("packages") if isinstance(value, dict) else value
    if isinstance(value, dict):
        if not set(value) <= PACKAGE_KEYS[key]:
            extra = sorted(set(value) - PACKAGE_KEYS[key])
            raise refuse(
                f"runtime_env.{key} may hold {', '.join(sorted(PACKAGE_KEYS[key]))}; not {', '.join(map(str, extra))}.",
                "runtime_env_invalid",
                loc,
                "unknown key",
            )
        _check_version(key, value.get(f"{key}_version"), loc + [f"{key}_version"])
        if not isinstance(value.get(f"{key}_check", False), bool):
            raise refuse(f"runtime_env.{key}.{key}_check must be a bool.", "runtime_env_invalid", loc, "not a bool")
    if not str_list(packages):
        # A string would be a requirements file read on the server.
        raise refuse(
            f"runtime_env.{key} must be a list of requirement strings (like 'numpy==2.1'), not a file on the server.",
            "runtime_env_invalid",
            loc,
            "not a list of requirements",
        )
    for i, entry in enumerate(packages):
        _check_requirement(key, entry, loc + [i], allowed_hosts)


def _check_requirement(key: str, entry: str, loc: list, allowed_hosts: frozenset[str]) -> None:
    shown = repr(entry[:200])
    if CONTROL_RE.search(entry):
        raise refuse(
            f"runtime_env.{key} entry {shown} holds a control character (a newline would be a second line of the "
            "requirements file Ray writes). Give one requirement per entry.",
            "runtime_env_invalid",
            loc,
            "control character",
        )
    if entry.lstrip().startswith(("-", "/", ".", "~", "file:")):
        raise refuse(
            f"runtime_env.{key} entry {shown} is not a requirement: installer options (-r, -e, --index-url) "
            "and local paths are not allowed; the cluster's installer configuration names the package index. "
            "Ship local code with working_dir or py_modules.",
            "runtime_env_invalid",
            loc,
            "option or path",
        )
    try:
        req = Requirement(entry)
    except InvalidRequirement as exc:
        raise refuse(
            f"runtime_env.{key} entry {shown} is not a requirement ({exc}). Give a name with an optional version "
            "(like 'numpy==2.1' or 'torch>=2.3'); installer options and URLs of other kinds are not allowed.",
            "runtime_env_invalid",
            loc,
            "not a PEP 508 requirement",
        ) from None
    if req.url is not None:
        parts = urlsplit(req.url)
        host = (parts.hostname or "").lower()
        if parts.scheme != "https" or host not in allowed_hosts:
            allowed = ", ".join(sorted(allowed_hosts)) or "none"
            raise refuse(
                f"runtime_env.{key} entry {shown} installs from a URL ({req.url[:200]}); this server installs from "
                f"URLs on its allowed hosts only (RAYDOCK_PIP_ALLOWED_HOSTS: {allowed}, over https). Name the "
                "package by version from the cluster's package index, or ask the operator to allow the host.",
                "runtime_env_invalid",
                loc,
                "direct URL reference",
            )


def _check_version(key: str, version: Any, loc: list) -> None:
    """``pip_version`` is appended to ``pip`` on Ray's command line: a version specifier only
    (``==23.3``), never ``@ https://...``."""
    if version is None:
        return
    try:
        ok = isinstance(version, str) and not CONTROL_RE.search(version) and SpecifierSet(version) is not None
    except InvalidSpecifier:
        ok = False
    if not ok:
        raise refuse(
            f"runtime_env.{key}.{key}_version {str(version)[:100]!r} is not a version specifier (like '==24.0').",
            "runtime_env_invalid",
            loc,
            "not a version specifier",
        )


def str_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_LIST
        and all(isinstance(v, str) and 0 < len(v) <= 4096 for v in value)
    )
