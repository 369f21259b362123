"""How replicas share the background work: the ``replicas`` section of
``service.settings.Settings``."""

from __future__ import annotations

from pydantic import Field

from service.settings.section import Section


class ReplicaSettings(Section):
    lease_ttl_s: float = Field(
        default=12.0,
        ge=1,
        le=600,
        description=(
            "How long a replica's lease on a background unit lasts unrenewed. Holders renew every quarter of it; "
            "another replica takes a dead holder's units within this plus 1 s (13 s by default), and a stopped "
            "one's within 1 s."
        ),
    )
