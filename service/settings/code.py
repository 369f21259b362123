"""What code jobs may ship from the server and upload: the ``code`` section of
``service.settings.Settings``."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field

from service.settings.section import Section


class CodeSettings(Section):
    code_root: str | None = Field(
        default=None,
        description=(
            "Directories on the server (separated by ':') whose contents jobs may ship to the cluster as "
            "`working_dir` or `runtime_env.py_modules`; a relative `working_dir` is taken from the first. "
            "Unset: jobs may name no server path (remote py_modules URIs still work)."
        ),
    )
    code_max_bytes: int = Field(
        default=100 * 1024 * 1024,
        ge=1,
        lt=2**31,
        description="Largest working_dir or py_module (bytes, all files together) a job may ship; also the cap of an uploaded package.",
    )
    code_max_files: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="Most files and directories a job's working_dir, py_module or uploaded package may hold.",
    )
    pip_allowed_hosts_raw: str = Field(
        default="",
        validation_alias=AliasChoices("RAYDOCK_PIP_ALLOWED_HOSTS"),
        description=(
            "Hosts (comma-separated) a runtime_env pip/uv entry may install from by URL (`pkg @ https://host/...`); "
            "unset: no direct URL references."
        ),
    )
    code_quota_bytes: int = Field(
        default=1 << 30,
        ge=1,
        lt=2**53,
        description="Most bytes of uploaded code packages one project may hold (413 code_quota_exceeded past it).",
    )
    code_retention_s: float = Field(
        default=7 * 86_400,
        ge=0,
        le=10 * 366 * 86_400,
        description="How long an uploaded code package that no job references is kept after its last upload or submit.",
    )

    @property
    def pip_allowed_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.pip_allowed_hosts_raw.split(",") if h.strip())

    @property
    def code_roots(self) -> list[Path]:
        """The code roots, symlinks and ``..`` resolved."""
        return [
            Path(os.path.realpath(os.path.expanduser(p))) for p in (self.code_root or "").split(os.pathsep) if p.strip()
        ]
