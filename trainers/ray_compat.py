"""The one seam between raydock and Ray Train's internals (``ray.train.v2._internal``).

Things raydock needs have no public API in Ray 2.60: hooks when a worker group
starts, a hook in each worker as it reports, a way to hand a run its starting
checkpoint (Train V2 dropped ``resume_from_checkpoint``), Tune's once-per-process
warning about its session API, re-armed, a Tune function's session in a process Tune did
not start, Ray's automatic ``ray.init`` turned off in a forked process, and whether an actor
of this job is being created. Tune's controller's own
books are ``trainers.tune_compat``'s. Everything else imports Ray's public surface only;
when a Ray upgrade moves these, this module and that one are the places to change.
"""

from __future__ import annotations

from typing import Any, Callable

try:
    # Ray Train's internal controller callback interface; RunConfig passes callbacks
    # that are not UserCallbacks through to the controller as they are.
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
except ImportError:  # a Ray without it: jobs run, only the worker_group events are missing
    WorkerGroupCallback = None
try:
    # Run in every Train worker around each ``ray.train.report`` (RunConfig passes it on too).
    from ray.train.v2._internal.execution.callback import TrainContextCallback
except ImportError:  # a Ray without it: a user loop's first_step phase is missing
    TrainContextCallback = None


def seed_checkpoint(checkpoint: Any) -> None:
    """Make ``ray.train.get_checkpoint()`` in this Train worker return ``checkpoint``
    until the run has one of its own. A retried worker group gets the run's own latest
    checkpoint in its context, which this leaves alone."""
    from ray.train.v2._internal.execution.context import get_train_context

    ctx = get_train_context()
    with ctx.report_order_condition:
        if ctx.checkpoint is None:
            ctx.checkpoint = checkpoint


def tune_session_calls_warn() -> None:
    """Make the next call of Tune's session API (``tune.report``, ``tune.get_checkpoint``)
    with no Tune session warn, as its first call in a process does: Ray warns once per
    process and name (``trainers.user_loop`` turns that warning into the loop's error)."""
    from ray.train._internal.session import SESSION_MISUSE_LOG_ONCE_KEY
    from ray.util.debug import reset_log_once

    for name in ("report", "get_checkpoint"):
        reset_log_once(f"{SESSION_MISUSE_LOG_ONCE_KEY}-{name}")


def session_dir() -> str | None:
    """This node's Ray session directory, in a process connected to Ray (a worker, a driver)."""
    import ray

    node = ray._private.worker._global_node
    return node.get_session_dir_path() if node is not None else None


def tune_stopping() -> bool:
    """Whether Tune asked the function trainable running in this thread's actor to end
    (its trial stops, or its actor is reset for another trial or an exploit): Tune's
    session sets this and waits a couple of seconds for the function to return."""
    from ray.train._internal.session import get_session

    session = get_session()
    return session is not None and session.stop_event.is_set()


# The fields of a Tune function trainable's session that ``tune.get_context()`` reads.
TUNE_SESSION_FIELDS = ("experiment_name", "trial_name", "trial_id", "run_id", "trial_resources", "trial_dir")


def tune_session_fields() -> dict[str, Any]:
    """What ``tune.get_context()`` answers in this function trainable's session (its
    trial's names, resources and directory), for a function run in another process."""
    from ray.train._internal.session import get_session

    session = get_session()
    return {name: getattr(session, name) for name in TUNE_SESSION_FIELDS}


def serve_tune_session(
    fields: dict[str, Any], report: Callable[[dict, Any], None], checkpoint: Callable[[], Any]
) -> None:
    """Give this process (a local rank running a Tune function trainable) a Tune session
    of its own: ``tune.report(metrics, checkpoint=)`` calls ``report``,
    ``tune.get_checkpoint()`` returns ``checkpoint()``, and ``tune.get_context()`` answers
    from ``fields`` (``tune_session_fields`` of the trainable). Tune's session API reads
    the module global ``ray.train._internal.session._session``; its ranks' fields are
    None, as in a function trainable's."""
    from ray.train._internal import session as train_session

    class Session:
        world_rank = local_rank = node_rank = local_world_size = world_size = metadata = None

        def __init__(self) -> None:
            self.__dict__.update(fields)

        def report(self, metrics: dict, checkpoint: Any = None) -> None:
            report(metrics, checkpoint)

        @property
        def loaded_checkpoint(self) -> Any:
            return checkpoint()

    train_session._session = Session()


# ----------------------------------------------------------------------------- local ranks
# Ray Train's local mode (``ScalingConfig(num_workers=0)``) with torchrun's environment is
# what a forked local rank runs (trainers.rank_worker); its report and get_checkpoint are
# raydock's, and its checkpoints keep Ray Train's storage layout and snapshot, so a run
# resumes from the other path's checkpoints and the other way round.


def run_local_mode(experiment_name: str, train_fn: Callable[[], Any], rank: Any) -> Any:
    """Run ``train_fn`` under Ray Train's local torch controller, which inits the process
    group from torchrun's variables and sets the rank's CUDA device. ``ray.train.report``,
    ``get_checkpoint`` and the collectives go to ``rank`` (``report(metrics, checkpoint,
    checkpoint_dir_name, upload_fn=, background=)``, ``checkpoint``, ``barrier()``,
    ``broadcast(data)``, ``storage``);
    ``get_context`` is local mode's, with this rank's numbers."""
    from ray.train.v2._internal.execution.local_mode.torch import LocalTorchController
    from ray.train.v2._internal.execution.train_fn_utils import (
        LocalTrainFnUtils,
        get_train_fn_utils,
        set_train_fn_utils,
    )

    class RankFnUtils(LocalTrainFnUtils):
        def report(
            self,
            metrics,
            checkpoint=None,
            checkpoint_dir_name=None,
            checkpoint_upload_mode=None,
            delete_local_checkpoint_after_upload=None,
            checkpoint_upload_fn=None,
            *args,
            **kwargs,
        ) -> None:
            self._last_metrics = metrics
            background = checkpoint_upload_mode is not None and checkpoint_upload_mode.name == "ASYNC"
            rank.report(metrics, checkpoint, checkpoint_dir_name, upload_fn=checkpoint_upload_fn, background=background)

        def get_checkpoint(self):
            return rank.checkpoint

        def barrier(self) -> None:
            rank.barrier()

        def broadcast_from_rank_zero(self, data: Any) -> Any:
            return rank.broadcast(data)

    class Controller(LocalTorchController):
        def _set_train_fn_utils(self) -> None:
            super()._set_train_fn_utils()
            c = get_train_fn_utils().get_context()
            set_train_fn_utils(
                RankFnUtils(
                    experiment_name=c.experiment_name,
                    world_size=c.world_size,
                    world_rank=c.world_rank,
                    local_rank=c.local_rank,
                    local_world_size=c.local_world_size,
                    node_rank=c.node_rank,
                )
            )

    return Controller(experiment_name=experiment_name).run(train_fn)


def rank_report(metrics: dict, checkpoint: Any) -> None:
    """In a local rank: what ``ray.train.report`` does there, past Ray's public function
    (which refuses to run where a Tune session is, as in a forked function trainable)."""
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    get_train_fn_utils().report(metrics, checkpoint)


def rank_checkpoint() -> Any:
    """In a local rank: ``ray.train.get_checkpoint()``, past Ray's public function."""
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    return get_train_fn_utils().get_checkpoint()


_LOCAL_STORAGE: list[Callable[[], Any]] = []  # set in a local rank: its run's storage


def current_storage() -> Any:
    """The run's storage context (``storage_context``), in a Train worker or a local rank."""
    if _LOCAL_STORAGE:
        return _LOCAL_STORAGE[0]()
    from ray.train.v2._internal.execution.context import get_train_context

    return get_train_context().get_storage()


def use_local_storage(storage: Callable[[], Any]) -> None:
    """In a local rank: ``current_storage()`` is ``storage()`` (local mode has none of its own)."""
    _LOCAL_STORAGE[:] = [storage]


def checkpoint_dir_name() -> str:
    """A new checkpoint's directory name, as Ray Train names it (``checkpoint_<time>``)."""
    from ray.train.v2._internal.execution.storage import StorageContext

    return StorageContext.make_default_checkpoint_dir_name()


def storage_context(storage_path: str, run_name: str) -> Any:
    """Ray Train's view of the run's storage: ``persist_current_checkpoint``,
    ``make_default_checkpoint_dir_name``, the run directory."""
    from ray.train.v2._internal.execution.storage import StorageContext

    return StorageContext(storage_path=storage_path, experiment_dir_name=run_name)


def checkpoint_book(storage: Any, checkpoint_config: Any) -> Any:
    """Ray Train's checkpoint manager of the run: it loads the run's snapshot (the
    checkpoints of earlier attempts), keeps ``num_to_keep`` by score plus the latest,
    deletes the others and writes the snapshot back, as Ray Train's controller does.
    ``register(checkpoint, metrics)`` adds one; ``latest`` is the latest checkpoint."""
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.training_report import _TrainingReport

    class Book(CheckpointManager):
        def _notify(self) -> None:  # nobody waits on the book: there is no controller event loop
            pass

        def register(self, checkpoint: Any, metrics: dict) -> None:
            self.register_checkpoint(_TrainingReport(checkpoint=checkpoint, metrics=metrics, validation=False))

        @property
        def latest(self) -> Any:
            result = self.latest_checkpoint_result
            return result.checkpoint if result else None

    return Book(checkpoint_config=checkpoint_config, storage_context=storage)


def checkpoint_at(storage: Any, dir_name: str) -> Any:
    """The checkpoint ``dir_name`` of the run ``storage`` (``storage_context``) holds."""
    from ray.train import Checkpoint

    return Checkpoint(path=storage.build_checkpoint_path_from_name(dir_name), filesystem=storage.storage_filesystem)


def reread_import_time_settings() -> None:
    """Ray settings read once when ``ray`` is imported, read again from this process's
    environment: a driver forked from a warm process imported ``ray`` under another
    environment (its job's ``RAY_DEDUP_LOGS=0`` must still hold)."""
    import ray._private.ray_constants as constants
    import ray._private.ray_logging as ray_logging

    dedup = constants.env_bool("RAY_DEDUP_LOGS", True)
    constants.RAY_DEDUP_LOGS = dedup
    ray_logging.RAY_DEDUP_LOGS = dedup


class RayNotHere(RuntimeError):
    """A Ray call in a process that is no Ray worker and must not become a driver."""


def refuse_ray_calls(why: str) -> None:
    """Make Ray's core API raise ``RayNotHere(why)`` in this process rather than join a
    cluster. With no driver connected, ``ray.put``, ``ray.get``, tasks, actors and Ray
    Data call ``ray.init()`` themselves: in a process raydock forked (a local rank) that
    would make it the driver of a Ray job of its own, one nobody tracks, outside its job's
    resources. Ray's own switch (``RAY_ENABLE_AUTO_CONNECT=0``) is read when ``ray`` is
    imported, before the fork: its module flag is set here, and what Ray calls before
    each core call raises instead (calls that read the flag say "Ray has not been
    started yet"); ``ray.init`` raises too."""
    import ray
    from ray._private import auto_init_hook

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise RayNotHere(why)

    auto_init_hook.enable_auto_connect = False
    auto_init_hook.auto_init_ray = refuse  # looked up by each wrapped call as it runs
    ray.init = refuse


# ----------------------------------------------------------------------------- shared capacity
# Ray Train sizes an elastic run from its autoscaling coordinator, which splits the
# cluster's total resources among the Train runs that told it what they hold, in start
# order. Local ranks hold theirs as a Ray job's entrypoint resources, which it cannot see:
# they say so as a Train run would, or an elastic run would count their CPUs as free.

RESERVATION_EXPIRE_S = 30.0  # a driver killed before it says goodbye holds nothing for longer
RESERVATION_RENEW_S = 10.0


def hold_like_a_train_run(requester_id: str, scaling: Any, num_workers: int) -> Callable[[], None]:
    """Register ``num_workers`` workers of ``scaling`` (a ``ScalingConfig``) with Ray
    Train's autoscaling coordinator until the returned function is called (or, for a
    driver killed first, until the last renewal expires). Needs ``ray.init``; any failure
    only leaves elastic runs their old view."""
    import threading

    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        ResourceRequestPriority,
        get_or_create_autoscaling_coordinator,
    )
    from ray.train._internal.autoscaling_coordinator_client import build_train_resource_request

    coordinator = get_or_create_autoscaling_coordinator()
    resources, selectors = build_train_resource_request(scaling, num_workers)
    done = threading.Event()

    def renew() -> None:
        while not done.is_set():
            try:  # as Ray Train asks for its own runs, with a shorter expiry
                coordinator.request_resources.remote(
                    requester_id=requester_id,
                    resources=resources,
                    label_selectors=selectors,
                    expire_after_s=RESERVATION_EXPIRE_S,
                    priority=ResourceRequestPriority.HIGH,
                )
            except Exception:  # noqa: BLE001 - the coordinator restarts; the next renewal tries again
                pass
            done.wait(RESERVATION_RENEW_S)

    threading.Thread(target=renew, name="raydock-train-reservation", daemon=True).start()

    def release() -> None:
        done.set()
        try:
            coordinator.cancel_request.remote(requester_id)
        except Exception:  # noqa: BLE001 - it expires on its own
            pass

    return release


def job_actor_starting() -> bool:
    """Whether an actor of this process' Ray job is being created (GCS's actor table:
    waiting for its resources' dependencies or running its constructor)."""
    import ray
    from ray._private.state import state

    job = ray.JobID(bytes.fromhex(ray.get_runtime_context().get_job_id()))
    try:
        return any(
            state.actor_table(None, job_id=job, actor_state_name=s)
            for s in ("DEPENDENCIES_UNREADY", "PENDING_CREATION")
        )
    except Exception:  # noqa: BLE001 - the table unreadable: say nothing starts
        return False
