"""The events token of a job's attempt: made when the attempt is prepared
(``service/attempts.py``), kept only as its hash on the job, checked on every events post.

A token is no secret from other jobs of the same Ray cluster (they run as the same OS
user and read the same storage): it lives in the attempt's launch file until the driver
has read it and in the job's processes after. So it is good for one attempt only (a new
attempt replaces the hash), every post must also name that attempt's Ray submission id,
and what a post can change is the job's own record and nothing the server holds.
"""

from __future__ import annotations

import hashlib
import secrets


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_events_token() -> tuple[str, str]:
    """A fresh events token and its hash (the store keeps only the hash)."""
    token = secrets.token_urlsafe(24)
    return token, token_hash(token)


def token_matches(stored_hash: str | None, token: str | None) -> bool:
    """Whether ``token`` is the one whose hash the job keeps (its current attempt's)."""
    return bool(token) and stored_hash is not None and secrets.compare_digest(stored_hash, token_hash(token))
