"""Routes of code packages: upload a job's code once (``PUT /v1/code/{sha256}``, the zip
as the body), ask whether the server has it (``HEAD`` / ``GET``), and the caps an
upload must keep (``GET /v1/code``). Jobs then name it as ``code: sha256:<hex>``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.errors import RaydockError
from api.schemas import SHA256_RE, CodeLimits, CodePackagePublic, ErrorResponse
from api.schemas.tenancy import PROJECT_RE
from service.http.access import read_project, write_project
from service.http.deps import AppSettings, Code, CurrentCaller, ProjectsDep, Uploads
from service.http.openapi import errors

router = APIRouter(tags=["code"])

Sha256 = Annotated[
    str,
    Path(
        pattern=SHA256_RE, min_length=64, max_length=64, description="The sha256 of the zip, 64 lowercase hex digits."
    ),
]
ProjectQuery = Annotated[
    str | None,
    Query(
        pattern=PROJECT_RE,
        max_length=63,
        description="The project that holds the package; leave out for your default project (GET /v1/me).",
    ),
]
ZIP_BODY = {
    "requestBody": {
        "required": True,
        "description": "The package: a zip whose entries are plain files under `code/` (what the SDK and CLI build).",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


class UploadTooSlow(RaydockError):
    close_connection = True  # the rest of the body is not waited for: the connection goes with the answer


def upload_too_slow(received: int, elapsed: float, min_rate: int) -> RaydockError:
    return UploadTooSlow(
        f"The upload arrived too slowly: {received} bytes in {elapsed:.0f} s, under the server's least average rate of "
        f"{min_rate} bytes/s (RAYDOCK_UPLOAD_MIN_BYTES_PER_S); nothing was stored. Upload again over a faster link, "
        "or ask the operator to lower the rate.",
        code="upload_too_slow",
        status=408,
    )


async def paced(body: AsyncIterator[bytes], min_rate: int, grace_s: float) -> AsyncIterator[bytes]:
    """The body's chunks, as long as they keep ``min_rate`` bytes/s on average once
    ``grace_s`` has passed: the next chunk is waited for only until the average would fall
    below it, so a trickle holds an upload place for a bounded time."""
    start, received = time.monotonic(), 0
    chunks = aiter(body)
    while True:
        due = max(grace_s, received / min_rate)  # seconds from the start by which the next byte must come
        try:
            chunk = await asyncio.wait_for(anext(chunks), timeout=max(0.0, start + due - time.monotonic()))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise upload_too_slow(received, time.monotonic() - start, min_rate) from None
        received += len(chunk)
        yield chunk


@router.get("/code", response_model=CodeLimits, operation_id="get_code_limits")
def code_limits(code: Code) -> CodeLimits:
    """The caps an upload must keep, and how long an unreferenced package is kept."""
    return code.limits()


@router.put(
    "/code/{sha256}",
    status_code=201,
    response_model=CodePackagePublic,
    operation_id="put_code",
    openapi_extra=ZIP_BODY,
    responses={
        201: {"description": "Stored."},
        200: {"model": CodePackagePublic, "description": "The server had these bytes already; nothing was read."},
        **errors(404, 408, 413, 422),
        429: {
            "model": ErrorResponse,
            "description": "More uploads at once than the server, the project or the user takes "
            "(RAYDOCK_MAX_CONCURRENT_UPLOADS, RAYDOCK_PROJECT_SHARE, RAYDOCK_USER_SHARE); Retry-After says when to try again.",
        },
    },
)
async def put_code(
    code: Code,
    sha256: Sha256,
    request: Request,
    response: Response,
    caller: CurrentCaller,
    projects: ProjectsDep,
    uploads: Uploads,
    settings: AppSettings,
    project: ProjectQuery = None,
) -> CodePackagePublic:
    """Upload a package to a project. Its sha256 must be the name; it is checked (caps, no
    links, no path out of the package, sizes that hold when unpacked) before anything is
    stored. Bytes another project holds are still uploaded: a project never learns what
    another one holds. One project takes at most RAYDOCK_PROJECT_SHARE of the server's
    RAYDOCK_MAX_CONCURRENT_UPLOADS at once, one user RAYDOCK_USER_SHARE; an upload slower than
    RAYDOCK_UPLOAD_MIN_BYTES_PER_S on average after RAYDOCK_UPLOAD_GRACE_S is cut (408
    `upload_too_slow`); a project holds at most RAYDOCK_CODE_QUOTA_BYTES of packages (413
    `code_quota_exceeded`)."""
    length = request.headers.get("content-length")
    into = await run_in_threadpool(write_project, caller, project, projects)
    release = uploads.take(caller, into)
    try:
        declared = int(length) if length and length.isdigit() else None
        body = paced(request.stream(), settings.clients.upload_min_bytes_per_s, settings.clients.upload_grace_s)
        stored = await code.receive(sha256, declared, body, into, actor=caller.name)
    except ClientDisconnect:  # the client went away mid-body; nothing was stored
        raise RaydockError(
            "The upload was cut off before its end; nothing was stored. Upload again.",
            code="upload_incomplete",
            status=400,
        ) from None
    finally:
        release()
    if not stored.created:
        response.status_code = 200
    return stored.package


@router.get(
    "/code/{sha256}", response_model=CodePackagePublic, operation_id="get_code", responses=errors(404, 409, 422)
)
def get_code(
    code: Code, sha256: Sha256, caller: CurrentCaller, projects: ProjectsDep, project: ProjectQuery = None
) -> CodePackagePublic:
    """A package the project holds: sizes, when it was last used, how many of the
    project's jobs reference it (409 ``code_package_altered`` when its stored bytes no
    longer hash to its name)."""
    return code.get(sha256, read_project(caller, project, projects), check=True)


@router.head(
    "/code/{sha256}",
    operation_id="head_code",
    responses={200: {"description": "Stored."}, 404: {"description": "Not stored."}},
)
def head_code(
    code: Code, sha256: Sha256, caller: CurrentCaller, projects: ProjectsDep, project: ProjectQuery = None
) -> Response:
    """200 when the project holds the package (its retention restarts), 404 when it must be uploaded."""
    # No body, as for any HEAD; the type says what a GET would answer.
    held = code.touch(sha256, read_project(caller, project, projects))
    return Response(status_code=404 if held is None else 200, media_type="application/json")
