"""Where the server posts its events, and how hard it tries: the ``webhooks`` section of
``service.settings.Settings``."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from service.settings.section import Section


class WebhookSettings(Section):
    webhooks_raw: str = Field(
        default="",
        validation_alias=AliasChoices("RAYDOCK_WEBHOOKS"),
        description=(
            'Server webhooks, a JSON list of {"name", "url", "events", "secret"}: every event of the listed types '
            '(["*"]: all) is posted to url, signed with secret.'
        ),
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhooks target loopback, link-local, private and other non-public addresses (refused by default).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="How long one whole webhook post may take."
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=100, description="Tries of one webhook delivery before it is marked failed."
    )
    webhook_backoff_s: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Wait before the second try of a delivery; doubled for each further try.",
    )
    webhook_backoff_max_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Longest wait between two tries of a delivery."
    )
    webhook_concurrency: int = Field(
        default=4, ge=1, le=256, description="Jobs' webhook posts in flight at once (each job posts one at a time)."
    )
