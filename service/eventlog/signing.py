"""Webhook signatures: ``Raydock-Signature: t=<unix seconds>,v1=<hex>`` where the hex is
HMAC-SHA256, keyed with the subscription's secret, of ``"<t>." + body``. The timestamp is
signed with the body, so a receiver that refuses an old ``t`` refuses a replayed post."""

from __future__ import annotations

import hashlib
import hmac
import time

DEFAULT_TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={signature(secret, t, body)}"


def verify(
    secret: str, value: str, body: bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None
) -> bool:
    """Whether ``value`` (the header) signs ``body`` with ``secret`` within ``tolerance_s``."""
    fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    try:
        t = int(fields.get("t", ""))
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    return hmac.compare_digest(fields.get("v1", ""), signature(secret, t, body))
