"""The background units (service/background/): a unit whose step fails has its failures
counted (on the unit and in /metrics) and goes on at its own pace, while another unit on
the same runner keeps doing its work. Real units (the tracking exporter, the webhook
fan-out) on real SQLite stores: the failing one's store has no tables."""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import sessionmaker

from service.background.periodic import Periodic
from service.background.runner import Runner
from service.db.engine import make_engine, make_sessionmaker
from service.db.eventlog_models import DeliveryRow
from service.eventlog.deliverer import Deliverer
from service.eventlog.log import record
from service.settings import Settings
from service.telemetry import instruments
from service.tracking.exporter import Exporter

HOOKS = [{"name": "ops", "url": "https://hooks.example.com/x", "events": ["*"], "secret": "s" * 16}]


def _count(unit: str, outcome: str) -> float:
    return (
        instruments.REGISTRY.get_sample_value("raydock_background_runs_total", {"unit": unit, "outcome": outcome})
        or 0.0
    )


def test_a_failing_unit_is_counted_and_never_stops_another(tmp_path):
    settings = Settings(storage={"data_dir": tmp_path}, webhooks={"webhooks_raw": json.dumps(HOOKS)})
    good = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'store.db'}"))
    broken = sessionmaker(create_engine(f"sqlite:///{tmp_path / 'empty.db'}"))  # a store without its tables
    failing = Periodic("tracking-export-broken", 0.01, Exporter(broken, settings).export_once, budget=2)
    fan_out = Periodic("webhook-fanout", 0.01, Deliverer(settings, good).fan_out)
    runner = Runner(observe=instruments.background_ran)
    failed_before = _count(failing.name, "failed")

    def deliveries() -> int:
        with good() as s:
            return s.scalar(select(func.count()).select_from(DeliveryRow))

    async def scenario() -> None:
        runner.start(failing)
        runner.start(fan_out)
        for _ in range(1000):  # until both have shown what they do (bounded by progress, not time)
            if failing.failures >= failing.budget + 1 and fan_out.runs >= 2:
                break
            await asyncio.sleep(0.01)
        with good.begin() as s:  # new events while the other unit keeps failing
            for i in range(3):
                record(s, "code_uploaded", actor="t", n=i)
        for _ in range(1000):
            if await asyncio.to_thread(deliveries) == 3:
                break
            await asyncio.sleep(0.01)
        assert sorted(runner.running()) == sorted([failing.name, fan_out.name])
        await runner.stop_all()

    asyncio.run(scenario())

    assert failing.failures >= failing.budget + 1 and failing.failures == failing.runs
    assert failing.failures_in_row == failing.failures
    assert _count(failing.name, "failed") - failed_before == failing.failures
    assert fan_out.failures == 0 and fan_out.runs >= 2
    assert _count(fan_out.name, "ok") >= fan_out.runs
    assert deliveries() == 3  # the healthy unit did its work while the other failed
    assert failing.pause_s() > failing.cadence_s()  # over its budget: it backs off
    assert runner.running() == []
    assert [u.name for u in runner.units()] == [failing.name, fan_out.name]
