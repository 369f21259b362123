"""Set-up run in every Ray worker process of a raydock job (runtime_env's
``worker_process_setup_hook``): the Train controller, its helpers and the workers.

Two fixes, both measured with bench/overhead.py and bench/job_timeline.py on 2 cores:

- Priority. Ray starts task and actor workers at nice 15 so its daemons stay
  responsive. A DDP step waits for its slowest rank, and a rank at nice 15 loses the
  CPU to every Ray daemon: steady step 1.23x vanilla DDP at nice 15, 1.05x at nice 0.
  Raising priority needs CAP_SYS_NICE (root in most containers); without it, no-op.
- The cluster address. Ray Train's placement-group cleaner polls the State API, which
  resolves the cluster from ``RAY_ADDRESS``; actors do not inherit the driver's, so with
  a non-default temp dir, or two clusters on one host, the lookup hangs on a guessed
  address until its 10 s timeout and every job's teardown waited ~12 s for it.
"""

from __future__ import annotations

import os


def setup() -> None:
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (PermissionError, OSError):
        pass
    if "RAY_ADDRESS" not in os.environ:
        import ray

        try:
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        except Exception:  # noqa: BLE001 - an unknown address leaves Ray's own lookup in place
            pass
