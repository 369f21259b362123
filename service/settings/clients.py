"""What one client, one user or one project may hold of the server: request sizes and
deadlines, connections, and the server-wide caps on streams, code uploads and downloads
with each user's and each project's share of them. The ``clients`` section of
``service.settings.Settings``."""

from __future__ import annotations

from pydantic import Field

from service.settings.section import Section


class ClientLimits(Section):
    max_request_bytes: int = Field(
        default=1 << 20, ge=1, description="Largest request body the API reads (413 above it)."
    )
    max_concurrent_downloads: int = Field(
        default=8,
        ge=1,
        le=10_000,
        description="Checkpoint downloads served at once; one more is turned away with 429 (too_many_downloads).",
    )
    max_concurrent_uploads: int = Field(
        default=4, ge=1, le=1000, description="Code uploads taken in at once; more get 429 too_many_uploads."
    )
    download_send_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A checkpoint download whose client reads nothing for this long is dropped.",
    )
    max_connections: int = Field(
        default=1000,
        ge=16,
        le=1_000_000,
        description=(
            "Most connections the API holds; past it a new connection closes the one that has waited longest for "
            "its request to arrive. Kept under the file descriptor limit (ulimit -n) less 256."
        ),
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="How long a request's headers may take to arrive (408 past it)."
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="Longest pause between two chunks of a request body (closed past it)."
    )
    keep_alive_timeout_s: int = Field(
        default=5, ge=1, le=3600, description="How long an idle keep-alive connection stays open."
    )
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=4096,
        le=1 << 20,
        description="Largest request line and headers the API reads (431 headers_too_large).",
    )
    max_streams: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Most streams (metrics SSE, followed logs) open at once; more get 429 `too_many_streams`.",
    )
    project_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "Fraction of each server-wide cap (streams, code uploads, checkpoint downloads) one project may hold; "
            "past it its next one gets the cap's 429. Server admins count towards the server-wide cap only."
        ),
    )
    user_share: float = Field(
        default=0.25, gt=0, le=1, description="Fraction of each server-wide cap one user may hold (as project_share)."
    )
    stream_idle_s: float = Field(
        default=300.0,
        ge=1,
        le=86_400,
        description="A stream of a job that has not been running for this long (queued, preempted) ends with a closing line.",
    )
    stream_recheck_s: float = Field(
        default=5.0,
        ge=0.1,
        le=3600,
        description="How often an open stream checks its caller again (a revoked token or a removed member ends it).",
    )
    upload_min_bytes_per_s: int = Field(
        default=16 * 1024,
        ge=1,
        le=1 << 30,
        description="Slowest average rate a code upload may keep after its grace period (408 upload_too_slow below it).",
    )
    upload_grace_s: float = Field(
        default=10.0, ge=0, le=3600, description="How long a code upload may take before its average rate counts."
    )
