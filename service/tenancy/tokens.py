"""API tokens: ``rdk_`` + 43 urlsafe characters (256 random bits), stored as their sha256.
A high-entropy token needs no slow hash: nobody can guess one from its digest."""

from __future__ import annotations

import hashlib
import secrets

from api.schemas.tenancy import TOKEN_PREFIX

MAX_TOKEN_CHARS = 128  # what a bearer header may carry before it is looked up at all


def new_token() -> tuple[str, str]:
    """A fresh token and its digest (the only part the store keeps)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def looks_like_token(value: str | None) -> bool:
    return bool(value) and value.startswith(TOKEN_PREFIX) and len(value) <= MAX_TOKEN_CHARS and value.isascii()
