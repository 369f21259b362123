"""Where jobs' reports are exported to experiment trackers: the ``tracking`` section of
``service.settings.Settings``."""

from __future__ import annotations

from pydantic import Field

from service.settings.section import Section


class TrackingSettings(Section):
    mlflow_tracking_uri: str | None = Field(
        default=None,
        max_length=2048,
        description="MLflow tracking URI jobs with `tracking.mlflow` export to (http(s)://, file:, sqlite:); unset: refused at submit.",
    )
    tracking_interval_s: float = Field(
        default=2.0, gt=0, le=3600, description="How often the tracking exporter looks for new reports to export."
    )
