"""Schemathesis hooks for tests/test_openapi_contract.py (loaded through SCHEMATHESIS_HOOKS).

The contract run's jobs stay QUEUED (its server's Ray address answers nothing), so a
metrics stream or a followed log would never end. Before such a request the job is
cancelled over the API, as a user would: the stream then ends, as it does for any job
that ends, and the request is still sent unchanged."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import schemathesis

STREAMS = {"GET /v1/jobs/{job_id}/metrics/stream", "GET /v1/jobs/{job_id}/logs"}
TRUE = {True, "true", "True", "1", "yes", "on", 1}


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.label not in STREAMS:
        return
    follow = (case.query or {}).get("follow") if isinstance(case.query, dict) else None
    follows = any(
        v in TRUE for v in (follow if isinstance(follow, list) else [follow]) if isinstance(v, (str, int, bool))
    )
    if case.operation.label.endswith("/logs") and not follows:
        return
    job_id = (case.path_parameters or {}).get("job_id")
    if isinstance(job_id, str) and job_id:
        base = case.operation.base_url.rstrip("/")
        httpx.post(f"{base}/v1/jobs/{quote(job_id, safe='')}/cancel", timeout=10)


# Fields a built-in model's spec refuses (they belong to user code). Generated specs carry
# them so often that hardly any submission is accepted, and the stateful phase then never
# reaches a real job id; so each generated spec with a built-in model may also be sent
# without them. The spec as generated stays one of the choices.
USER_CODE_ONLY = ("entrypoint", "working_dir", "code", "runtime_env", "schedule")


@schemathesis.hook
def flatmap_body(context, body):
    from hypothesis import strategies as st

    operation = getattr(context, "operation", None)
    if getattr(operation, "label", None) != "POST /v1/jobs" or not isinstance(body, dict):
        return st.just(body)
    spec = body.get("base") if body.get("kind") == "tune" and isinstance(body.get("base"), dict) else body
    if not isinstance(spec.get("model"), dict):
        return st.just(body)
    trimmed = {k: v for k, v in spec.items() if k not in USER_CODE_ONLY}
    if spec is not body:
        trimmed = {**body, "base": trimmed}
    return st.sampled_from([body, trimmed])
