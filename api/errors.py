"""Errors a user can act on, shared by the server and the SDK.

The server turns each into ``{"error": {"code", "message", "details"}}`` with its HTTP
status; the SDK reads the code back and raises the same class, so a caller can write
``except CapacityExceeded`` whether it called the service in-process or over HTTP.
"""

from __future__ import annotations

from typing import Any


class RaydockError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
        status: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.status = status or type(self).status
        self.details = details or []

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.code, self.details, self.status))

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


def _rebuild(cls, message, code, details, status):
    return cls(message, code=code, details=details, status=status)


class InvalidSpec(RaydockError):
    status, code = 422, "invalid_spec"


class CapacityExceeded(RaydockError):
    status, code = 422, "exceeds_cluster_capacity"


class NotFound(RaydockError):
    status, code = 404, "not_found"


class Conflict(RaydockError):
    status, code = 409, "conflict"


class Unauthorized(RaydockError):
    status, code = 401, "unauthorized"


class ClusterUnavailable(RaydockError):
    """The Ray cluster did not answer (the server raises it on any failed dashboard call)."""

    status, code = 503, "cluster_unavailable"


class Busy(RaydockError):
    """The server is doing as many of something as it takes at once (downloads, uploads,
    streams, a job's events post); the ``code`` says which. Retry after ``retry_after_s``."""

    status, code = 429, "busy"
    retry_after_s: float | None = None

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class QuotaExceeded(RaydockError):
    """A submit past its project's ``max_queued``: the message names the quota and the usage."""

    status, code = 429, "quota_exceeded"


class CodeTooLarge(InvalidSpec):
    """A job's code over the size or file-count cap (413 on upload; 422 for a server path)."""

    status, code = 413, "code_too_large"


_BY_CODE: dict[str, type[RaydockError]] = {
    c.code: c
    for c in (
        InvalidSpec,
        CapacityExceeded,
        NotFound,
        Conflict,
        Unauthorized,
        ClusterUnavailable,
        CodeTooLarge,
        QuotaExceeded,
    )
}
# A more specific code of a known kind (e.g. `job_not_found`) maps by its HTTP status.
_BY_STATUS: dict[int, type[RaydockError]] = {
    c.status: c for c in (InvalidSpec, NotFound, Conflict, Unauthorized, ClusterUnavailable, Busy)
}


def job_not_found(job_id: str) -> NotFound:
    """The refusal of a job id that names no job."""
    return NotFound(f"No job {job_id!r}. List jobs with GET /v1/jobs.", code="job_not_found")


def error_from_body(status: int, body: Any) -> RaydockError:
    """Rebuild the server's error on the client side."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return RaydockError(f"HTTP {status}: {body!r}"[:2000], code="http_error", status=status)
    cls = _BY_CODE.get(err.get("code", "")) or _BY_STATUS.get(status, RaydockError)
    return cls(err.get("message", ""), code=err.get("code"), details=err.get("details") or [], status=status)


def retry_after_s(headers: Any) -> float | None:
    """The seconds of a ``Retry-After`` header given in seconds, if any."""
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None
