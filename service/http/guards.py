"""What every request passes before any route runs: the Host check that keeps a
loopback server without a token out of reach of DNS rebinding; without a token, the
check that the peer itself is on loopback (the configured host is not the bound socket:
a server started behind ``--host 0.0.0.0`` is still closed to others); with one, the API
token, checked here so that no body is read for a request without it; and the request
body limit, enforced on the declared length and again on the bytes as they arrive, so no
body is ever read past the limit. Plain ASGI, so it also covers /docs and unknown paths."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import RaydockError, Unauthorized
from service.http.auth import UNAUTHORIZED, Authenticator, bearer_token, token_matches
from service.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
EVENTS_PREFIX = "/v1/internal/"  # the events channel: each job's own events token, from any node


def wrong_token() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED)


def is_loopback_peer(client: tuple[str, int] | None) -> bool:
    """A socket peer on loopback (an IPv4-mapped IPv6 address counts); a Unix socket has no peer address."""
    if client is None:
        return True
    try:
        address = ipaddress.ip_address(client[0].split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


class RequestTooLarge(HTTPException):
    """Raised while the body streams in; FastAPI re-raises HTTPExceptions from its body
    read, so the app's handler answers it in raydock's error format."""

    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large(limit).message)


def too_large(limit: int) -> RaydockError:
    return RaydockError(
        f"The request body is larger than {limit} bytes. Send a smaller body, or raise RAYDOCK_MAX_REQUEST_BYTES on the server.",
        code="request_too_large",
        status=413,
    )


def host_name(host_header: str) -> str:
    """``example.com:8000`` -> ``example.com``; ``[::1]:8000`` -> ``[::1]``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """Names the Host header may carry; None when any is fine (an API token is required,
    or the server listens beyond loopback, where a token is mandatory anyway)."""
    if settings.auth.api_token or not settings.http.is_loopback:
        return None
    names = set(LOOPBACK_NAMES) | {host_name(settings.http.host)}
    if settings.http.public_url:  # what the cluster's drivers use to push events here
        names.add(host_name(urlsplit(settings.http.public_url).netloc))
    return frozenset(names)


def may_have_body(headers: Headers) -> bool:
    """HTTP/1.1 frames a request body by Content-Length or Transfer-Encoding: without
    either there is none to count (most requests: every GET a client polls with)."""
    length = headers.get("content-length")
    return (length is not None and length != "0") or "transfer-encoding" in headers


class RequestGuard:
    """``own_limit_prefixes``: paths whose route counts its body against a cap of its
    own as the bytes arrive (a code package upload, ``service/code/packages.py``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: frozenset[str] | None,
        max_body_bytes: int,
        own_limit_prefixes: tuple[str, ...] = (),
        token: str | None = None,
        open_docs: bool = False,
        auth: Authenticator | None = None,
    ) -> None:
        self.app, self.hosts, self.limit, self.own_limit = app, hosts, max_body_bytes, own_limit_prefixes
        self.token, self.open_docs, self.auth = token, open_docs, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limited = not (self.own_limit and scope["path"].startswith(self.own_limit))
        headers = Headers(scope=scope)
        refusal = (
            self._peer_refusal(scope, headers) or await self._who(scope, headers) or self._refusal(headers, limited)
        )
        if refusal is not None:
            return await JSONResponse(refusal.to_body(), status_code=refusal.status)(scope, receive, send)
        if not limited or not may_have_body(headers):
            return await self.app(scope, receive, send)
        await self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        received, started = 0, False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise RequestTooLarge(self.limit)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except RequestTooLarge:
            if started:
                raise
            err = too_large(self.limit)
            await JSONResponse(err.to_body(), status_code=413)(scope, receive, send)

    def _peer_refusal(self, scope: Scope, headers: Headers) -> RaydockError | None:
        path = scope["path"]
        if path.startswith(EVENTS_PREFIX):
            return None
        if self.token is None:
            if is_loopback_peer(scope.get("client")):
                return None
            return RaydockError(
                "This server has no API token and answers only clients on this machine (loopback); "
                f"{scope['client'][0]} is not. Set RAYDOCK_API_TOKEN on the server and send it, or connect from the server's host.",
                code="peer_not_allowed",
                status=403,
            )
        if path in DOC_PATHS and not self.open_docs:  # the API's description: RAYDOCK_API_TOKEN's holder
            return None if token_matches(bearer_token(headers.get("authorization")), self.token) else wrong_token()
        return None

    async def _who(self, scope: Scope, headers: Headers) -> RaydockError | None:
        """The caller of a /v1 request (``service/http/auth.py``), kept in the request's
        state for the routes; a refusal when the request says nobody it may act as."""
        path = scope["path"]
        if self.auth is None or path.startswith(EVENTS_PREFIX) or not (path.startswith("/v1/") or path == "/v1"):
            return None
        caller = await self.auth.caller(headers.get("authorization"))
        if isinstance(caller, RaydockError):
            return caller
        scope.setdefault("state", {})["caller"] = caller
        return None

    def _refusal(self, headers: Headers, limited: bool = True) -> RaydockError | None:
        if self.hosts is not None and host_name(headers.get("host", "")) not in self.hosts:
            return RaydockError(
                "This server listens on loopback without an API token and answers only requests for "
                f"{', '.join(sorted(LOOPBACK_NAMES))} (a guard against DNS rebinding). Use one of those names, "
                "or set RAYDOCK_API_TOKEN.",
                code="host_not_allowed",
                status=400,
            )
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return RaydockError(
                    "Content-Length must be a non-negative integer.", code="invalid_request", status=400
                )
            if limited and int(length) > self.limit:
                return too_large(self.limit)
        return None
