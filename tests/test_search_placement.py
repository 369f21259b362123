"""A search's placement groups (``SettledRemoval`` in trainers/tune_compat.py): one Tune asked
for and no longer wants is removed only once Ray has placed it, never while the raylet may be
preparing it (Ray 2.60 leaks the CPU of a bundle removed then), and the CPUs it held are free
again after."""

from __future__ import annotations

import shlex
import sys
import textwrap
import uuid
from pathlib import Path

from bench.harness.waiting import wait_for
from tests.support import cluster_teardown

REPO = Path(__file__).resolve().parents[1]

# Runs as a Ray job on the session cluster: Tune's manager as the search's driver builds it.
CANCEL_AT_ONCE = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import ray
    from ray.air.execution.resources.request import ResourceRequest
    from ray.util import placement_group_table
    from trainers.tune_compat import SettledRemoval

    ray.init()
    manager = SettledRemoval(update_interval_s=0)
    request = ResourceRequest([{"CPU": 0.5}])
    manager.request_resources(request)
    (pg,) = manager._staging_future_to_pg.values()
    manager.cancel_resource_request(request)  # at once: Ray may be preparing its bundle now
    print("after cancel:", placement_group_table(pg)["state"], flush=True)
    deadline = time.monotonic() + 60
    while placement_group_table(pg)["state"] != "REMOVED" and time.monotonic() < deadline:
        manager.update_state()
        time.sleep(0.05)
    print("in the end:", placement_group_table(pg)["state"], flush=True)
    manager.clear()
    """
)


def test_a_placement_group_no_longer_wanted_goes_once_placed_and_frees_its_cpus(ray_head, tmp_path):
    script = tmp_path / "cancel_at_once.py"
    script.write_text(CANCEL_AT_ONCE)
    ray = cluster_teardown._backend(ray_head)
    before = ray.cluster_info().cpus_free
    submission_id = f"placement-{uuid.uuid4().hex[:8]}"
    ray.jobs.submit_job(entrypoint=shlex.join([sys.executable, str(script), str(REPO)]), submission_id=submission_id)
    status = wait_for(
        lambda: (s := ray.jobs.get_job_status(submission_id)).is_terminal() and s, 120, "the script to end"
    )
    logs = ray.logs(submission_id)
    assert status.value == "SUCCEEDED", logs
    after_cancel = next(line for line in logs.splitlines() if line.startswith("after cancel:"))
    assert "REMOVED" not in after_cancel, logs  # Tune's own manager removes it right away
    assert "in the end: REMOVED" in logs, logs
    wait_for(lambda: ray.cluster_info().cpus_free >= before, 30, "the group's CPUs to be free again")
