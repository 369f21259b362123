"""Where the API listens and who may call it: the ``http`` and ``auth`` sections of
``service.settings.Settings``."""

from __future__ import annotations

import ipaddress

from pydantic import Field

from api.schemas.tenancy import DEFAULT_TOKEN_TTL_DAYS, MAX_TOKEN_TTL_DAYS
from service.settings.section import Section


class HttpSettings(Section):
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8000, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None,
        description="URL the cluster uses to reach this API for live events; derived from host/port when unset.",
    )
    open_docs: bool = Field(
        default=False,
        description="Serve /docs, /redoc and /openapi.json without the API token (they need it when one is set).",
    )

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def events_base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host
        return f"http://{host}:{self.port}"


class AuthSettings(Section):
    api_token: str | None = Field(default=None, description="Bearer token required by the API; mandatory off loopback.")
    metrics_token: str | None = Field(
        default=None,
        max_length=512,
        description="Bearer token GET /metrics requires instead of the API token (for a Prometheus that holds no API token).",
    )
    max_token_ttl_days: float = Field(
        default=DEFAULT_TOKEN_TTL_DAYS,
        gt=0,
        le=MAX_TOKEN_TTL_DAYS,
        description="The longest an API token made over the API lives: one asked for with no expiry gets this one; "
        "one asked for longer is refused (422 token_lifetime_too_long).",
    )
    token_cache_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="How long the user a token names is remembered (0: looked up on every request). A token revoked "
        "or a member removed through this replica stops working at once; through another replica, within this long.",
    )
