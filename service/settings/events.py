"""What one job's events and log may store, and how a post of them is taken in: the
``events`` section of ``service.settings.Settings``. Each bound is defined here once;
``service/events/limits.py`` applies them (past one, an event is dropped and counted,
its reason naming the variable to raise)."""

from __future__ import annotations

from pydantic import Field

from service.settings.section import Section


class EventSettings(Section):
    max_metrics_per_job: int = Field(
        default=1_000_000, ge=1, lt=2**31, description="Most metric reports stored per job."
    )
    max_trial_reports_per_job: int = Field(
        default=1_000_000, ge=1, lt=2**31, description="Most trial reports stored per search."
    )
    max_trials_per_job: int = Field(default=10_000, ge=1, lt=2**31, description="Most trials stored per search.")
    max_worker_groups_per_job: int = Field(
        default=10_000, ge=1, lt=2**31, description="Most worker-group starts stored per job."
    )
    max_checkpoints_per_job: int = Field(
        default=100_000, ge=1, lt=2**31, description="Most checkpoint rows stored per job."
    )
    max_exploits_per_job: int = Field(
        default=100_000, ge=1, lt=2**31, description="Most PBT exploits stored per search."
    )
    max_restarts_kept: int = Field(
        default=10, ge=1, le=1000, description="Newest worker restarts a job record lists (all are counted)."
    )
    max_log_events_per_job: int = Field(
        default=10_000,
        ge=10,
        lt=2**31,
        description=(
            "Most event-log rows a job's own events make (checkpointed, retried, resized); past it they are counted, "
            "not logged. Status changes and what callers do are always logged."
        ),
    )
    max_log_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        le=1 << 40,
        description=(
            "Most bytes of one job's log kept in the store: the first quarter (the head) and the newest rest (the tail); "
            "the middle is dropped and a line in its place says how many bytes. Events in dropped text are still taken in."
        ),
    )
    max_search_events_per_push: int = Field(
        default=200,
        ge=1,
        le=1000,
        description="Most search events (trial reports, trial statuses, exploits) in one events post.",
    )
    events_per_transaction: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Events of a post stored per transaction, so a push holds the write lock briefly.",
    )
