"""The Ray job driver of one raydock training job: ``python -m trainers.driver``.

The server submits this module through the Ray Jobs API (``trainers.launch`` reads
what it hands over). It builds the job's ``TorchTrainer`` (``trainers.trainer``) with
the callbacks that send every report to the server as an event (``trainers.callbacks``),
and on failure says why (``trainers.failures``). Because it runs on the cluster, a job
outlives the API process. A search (``kind: tune``) has its own driver,
``python -m tuning.search_driver``.
"""

from __future__ import annotations

import sys

import ray

from api.schemas import ResultEvent, StartedEvent, TrainSpec
from trainers import events
from trainers.callbacks import run_callbacks
from trainers.failures import classify, report_failure
from trainers.launch import take_launch
from trainers.trainer import build_trainer
from trainers.zygote import pool


def main() -> int:
    pool.start_if_asked()  # a cold start: this node's next job starts warm
    launch = take_launch()
    spec = TrainSpec.model_validate(launch.spec)
    events.emit(StartedEvent(type="started", seq=0))
    try:
        ray.init(address="auto", log_to_driver=True)
        result = build_trainer(spec, launch.job_id, launch.storage_path, run_callbacks()).fit()
    except (KeyboardInterrupt, SystemExit):
        raise  # a stop (cancel, deadline): the server already knows why
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then exit 1
        return report_failure(classify(exc))
    final = events.sendable_metrics(result.metrics or {})
    events.emit(ResultEvent(type="result", seq=0, metrics=final, path=result.path))
    events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
