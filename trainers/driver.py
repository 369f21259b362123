"""The Ray job driver of one raydock training job: ``python -m trainers.driver``.

The server submits this module through the Ray Jobs API (``trainers.launch`` reads
what it hands over). It builds the job's ``TorchTrainer`` (``trainers.trainer``) with
the callbacks that send every report to the server as an event (``trainers.callbacks``),
and on failure says why (``trainers.failures``). A job whose Ray job holds all its
workers' resources (the server's decision, ``service.scheduling.rank_plan``) runs them as ranks
forked from this process instead (``trainers.ranks``). Because it runs on the cluster, a job
outlives the API process. A search (``kind: tune``) has its own driver,
``python -m tuning.search_driver``.
"""

from __future__ import annotations

import sys

import ray

from api.schemas import ResultEvent, StartedEvent, TrainSpec
from trainers import events, phases, ray_compat
from trainers.callbacks import run_callbacks
from trainers.data.sources import start_keeper
from trainers.failures import classify, report_failure
from trainers.launch import take_launch
from trainers.ranks import RankRunner, RanksFailed, uses_local_ranks
from trainers.trainer import build_trainer, scaling_config
from trainers.zygote import pool


def main() -> int:
    pool.start_if_asked()  # a cold start: this node's next job starts warm
    launch = take_launch()
    spec = TrainSpec.model_validate(launch.spec)
    if uses_local_ranks(launch.local_ranks, spec):
        return run_local(spec, launch)
    phases.bind(launch.channel)
    phases.mark("driver_started", phases.process_started_at())
    events.emit(StartedEvent(type="started", seq=0))
    try:
        ray.init(address="auto", log_to_driver=True)
        trainer = build_trainer(spec, launch.job_id, launch.storage_path, run_callbacks(), launch.init_checkpoint)
        result = trainer.fit()
    except (KeyboardInterrupt, SystemExit):
        raise  # a stop (cancel, deadline): the server already knows why
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then exit 1
        return report_failure(classify(exc))
    return finish(result.metrics, result.path)


def run_local(spec: TrainSpec, launch) -> int:
    """The job's workers as ranks forked from this process (``trainers.ranks``). Nothing
    before the first fork may start a thread (the events thread, Ray's): the ranks are
    forked from a single-threaded process, or else started from a forkserver."""

    # Unbound, a mark goes to the job's log: pushing it would start the events thread now.
    phases.mark("driver_started", phases.process_started_at())

    release: list = []

    def after_fork() -> None:
        phases.bind(launch.channel)
        events.emit(StartedEvent(type="started", seq=0))
        ray.init(address="auto", log_to_driver=True)  # the worker_group event names this node
        start_keeper()  # the ranks use the node's data cache outside Ray: their driver starts its keeper
        num = spec.scaling.num_workers
        release.append(ray_compat.hold_like_a_train_run(f"raydock-{launch.job_id}", scaling_config(spec), num))

    try:
        runner = RankRunner(spec, launch.job_id, launch.storage_path, launch.init_checkpoint)
        runner.after_start = after_fork
        result = runner.fit()
    except (KeyboardInterrupt, SystemExit):
        raise
    except RanksFailed as exc:
        return report_failure(exc.failure)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then exit 1
        return report_failure(classify(exc))
    finally:
        for done in release:
            done()
    return finish(result.metrics, result.path)


def finish(metrics: dict | None, path: str | None) -> int:
    final = events.sendable_metrics(metrics or {})
    events.emit(ResultEvent(type="result", seq=0, metrics=final, path=path))
    events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
