"""The background units under a unit that fails on every run, measured against their bounds.

    .venv/bin/python -m bench.abuse_periodic

Real units on real SQLite stores (no Ray): the tracking exporter on a store without its
tables (every run fails) beside the webhook fan-out on a healthy store, both every 50 ms.
One row per figure, ``what | figure | bound | ok/FAIL``:

- the failing unit's runs in a 3 s window: past its budget it backs off instead of
  failing (and logging a stack) every cadence;
- the healthy unit's runs in the same window: the other's failures cost it nothing;
- the threads the runner starts for seven units, one of which asks for its own loop;
- how long stopping them all takes.

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from bench.figures import row, run_attacks
from service.background.periodic import Periodic
from service.background.runner import Runner
from service.db.engine import make_engine, make_sessionmaker
from service.eventlog.deliverer import POLL_S, Deliverer
from service.settings import Settings
from service.tracking.exporter import Exporter

WINDOW_S = 3.0
CADENCE_S = 0.05
HOOKS = [{"name": "ops", "url": "https://hooks.example.com/x", "events": ["*"], "secret": "s" * 16}]


def _raydock_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("raydock-")}


def failing_beside_healthy(root: Path) -> None:
    settings = Settings(storage={"data_dir": root / "d"}, webhooks={"webhooks_raw": json.dumps(HOOKS)})
    good = make_sessionmaker(make_engine(f"sqlite:///{root / 'store.db'}"))
    broken = sessionmaker(create_engine(f"sqlite:///{root / 'empty.db'}"))
    deliverer = Deliverer(settings, good)
    failing = Periodic("failing", CADENCE_S, Exporter(broken, settings).export_once, max_backoff_s=1.0)
    healthy = Periodic("healthy", CADENCE_S, deliverer.fan_out)
    idle = [Periodic(f"idle-{i}", 60.0, lambda: None) for i in range(4)]
    webhooks = Periodic("webhooks", POLL_S, deliverer.deliver_once, own_thread=True, on_stop=deliverer.aclose)
    runner = Runner()

    async def scenario() -> tuple[set[str], float]:
        before = _raydock_threads()
        for unit in (failing, healthy, *idle, webhooks):
            runner.start(unit)
        await asyncio.sleep(WINDOW_S)
        started = _raydock_threads() - before
        t0 = time.perf_counter()
        await runner.stop_all()
        return started, time.perf_counter() - t0

    logging.getLogger("raydock.background").setLevel(logging.CRITICAL)  # the failing unit's stacks
    started, stop_s = asyncio.run(scenario())
    budget_runs = failing.budget + WINDOW_S / 1.0 + 2
    row(
        f"runs of a unit failing every {CADENCE_S * 1000:.0f} ms in {WINDOW_S:g} s",
        f"{failing.runs} ({failing.failures} failed)",
        f"<= {budget_runs:.0f} (budget {failing.budget}, then backs off)",
        failing.runs <= budget_runs and failing.failures == failing.runs,
    )
    row(
        f"runs of a healthy unit beside it in {WINDOW_S:g} s",
        f"{healthy.runs} ({healthy.failures} failed)",
        ">= 20, none failed",
        healthy.runs >= 20 and healthy.failures == 0,
    )
    row("threads started for 7 units, 1 on a loop of its own", f"{len(started)}", "1", len(started) == 1)
    row("stopping all 7 units", f"{stop_s:.2f} s", "< 2 s", stop_s < 2 and runner.running() == [])


def main() -> int:
    return run_attacks("periodic", failing_beside_healthy)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
