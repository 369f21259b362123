"""What the OpenAPI document says beyond the routes' own types: the error statuses each
route can answer (in raydock's error body) and the links from a job to the operations
on it, which let a client or a stateful test walk from ``POST /v1/jobs`` to real ids."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from api.schemas import ErrorResponse

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}

DESCRIPTIONS = {
    400: "The request could not be read (Host not allowed, malformed body or headers).",
    401: "Missing, wrong, revoked or expired API token (a user token or RAYDOCK_API_TOKEN).",
    403: "The caller may not do this: a server admin's route, or a change by a viewer of the project.",
    404: "No such job (or checkpoint, or trial).",
    408: "The request arrived too slowly (an upload under RAYDOCK_UPLOAD_MIN_BYTES_PER_S on average).",
    409: "The job is not in a status (or of a kind) that allows this.",
    413: "The request body is over the server's limit (RAYDOCK_MAX_REQUEST_BYTES).",
    422: "A parameter or the body is invalid; `details` lists each problem with its location.",
    429: "The server is serving as many of these as it takes at once (downloads, uploads, streams, an events post in flight); the `code` says which, and `details` whether the server, the project or the user holds its share. Retry after the Retry-After header's seconds.",
    503: "The Ray cluster did not answer.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status with raydock's error body."""
    return {s: {"model": ErrorResponse, "description": DESCRIPTIONS[s]} for s in statuses}


def _link(operation_id: str, description: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": {"job_id": "$response.body#/id"}, "description": description}


JOB_LINKS = {
    "GetJob": _link("get_job", "The job's record."),
    "CancelJob": _link("cancel_job", "Cancel the job."),
    "ResumeJob": _link("resume_job", "Resume the job once it FAILED or was CANCELLED."),
    "DeleteJob": _link("delete_job", "Delete the job once it ended."),
    "GetMetrics": _link("get_metrics", "The job's reports."),
    "GetLogs": _link("get_logs", "The job's log."),
    "ListCheckpoints": _link("list_checkpoints", "The job's checkpoints."),
    "ListWorkerGroups": _link("list_worker_groups", "The job's worker groups."),
}  # trials, lineage and best exist for searches only (409 `not_a_search` for a train job): no link


def job_response(description: str) -> dict[str, Any]:
    """A success response that returns a job, with the links to what can be done with it."""
    return {"description": description, "links": JOB_LINKS}


def errors_as_json(app: FastAPI) -> None:
    """Every error answers in JSON, whatever the route's success media type (FastAPI
    would document a log route's 404 as text/plain); the document says so."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    for status, response in operation.get("responses", {}).items():
                        if status[:1] in ("4", "5"):
                            response["content"] = {"application/json": {"schema": ERROR_SCHEMA}}
        return app.openapi_schema

    app.openapi = openapi
