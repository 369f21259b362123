"""The suite's own guard (tests/support/cluster_teardown.py) against the session cluster: what a
test leaves holding CPUs is freed at its teardown, even a driver that outlived the Ray job
that started it (a warm driver is a child of the node's warm process, not of the entrypoint
Ray stops)."""

from __future__ import annotations

import shlex
import sys
import textwrap
import uuid

from bench.harness.waiting import wait_for
from tests.support import cluster_teardown

HOLDER = textwrap.dedent(
    """
    import time, ray
    ray.init()

    @ray.remote(num_cpus=1)
    class Holder:
        def ping(self):
            return 1

    holder = Holder.remote()
    ray.get(holder.ping.remote())
    time.sleep(600)
    """
)
# The holder is no descendant of the entrypoint (a process between them starts it in a
# session of its own and exits), as a warm driver is a child of the node's warm process: Ray's
# stop of the job, which ends the entrypoint and its descendants, does not reach it.
SPAWN = textwrap.dedent(
    """
    import os, subprocess, sys
    subprocess.Popen([sys.executable, sys.argv[1]], start_new_session=True)
    os._exit(0)
    """
)
ENTRYPOINT = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.run([sys.executable, sys.argv[1], sys.argv[2]])
    time.sleep(600)
    """
)


def test_a_driver_that_outlives_its_ray_job_is_killed_and_its_cpus_freed(ray_head, tmp_path):
    scripts = {name: tmp_path / f"{name}.py" for name in ("entrypoint", "spawn", "holder")}
    for (name, path), text in zip(scripts.items(), (ENTRYPOINT, SPAWN, HOLDER)):
        path.write_text(text)
    ray = cluster_teardown._backend(ray_head)
    before = cluster_teardown.snapshot(ray_head)
    submission_id = f"teardown-{uuid.uuid4().hex[:8]}"
    ray.jobs.submit_job(
        entrypoint=shlex.join([sys.executable, *map(str, scripts.values())]), submission_id=submission_id
    )
    try:
        wait_for(lambda: ray.cluster_info().cpus_free <= before.cpus_free - 1, 60, "the holder's actor to take a CPU")
    except AssertionError:
        print(ray.logs(submission_id))
        raise

    cluster_teardown.restore(ray_head, before, "the planted holder")  # fails the test if the CPU stays held

    assert ray.cluster_info().cpus_free >= before.cpus_free
    assert not any(j.is_active for j in ray.list_jobs() if j.submission_id == submission_id)
