"""What the API answers about code packages: the zips a job's code travels in
(``PUT /v1/code/{sha256}``, referenced from a spec as ``code: sha256:<hex>``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.schemas.jobs import UtcDatetime

CODE_REF_PREFIX = "sha256:"
SHA256_RE = r"^[0-9a-f]{64}$"
CODE_REF_RE = r"^sha256:[0-9a-f]{64}$"


class CodePackagePublic(BaseModel):
    sha256: str = Field(description="The sha256 of the zip, hex: the package's name.")
    size_bytes: int = Field(description="Bytes of the zip as stored.")
    files: int = Field(description="Files in the package.")
    content_bytes: int = Field(description="Bytes of the files, uncompressed.")
    created_at: UtcDatetime = Field(description="When the server first stored it.")
    last_used_at: UtcDatetime = Field(
        description="The last upload or submit that named it; retention counts from here."
    )
    jobs: int = Field(
        description="Jobs that reference it; a package no job references is deleted after the retention period."
    )


class CodeLimits(BaseModel):
    max_bytes: int = Field(
        description="Most bytes a package may hold, uncompressed and as uploaded (RAYDOCK_CODE_MAX_BYTES)."
    )
    max_files: int = Field(description="Most files a package may hold (RAYDOCK_CODE_MAX_FILES).")
    retention_s: float = Field(description="How long a package no job references is kept (RAYDOCK_CODE_RETENTION_S).")
