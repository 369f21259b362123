"""The monitor's incremental log reads against a real Ray head: a plain Ray job (no
training) prints a log over a MiB with events in it; read tick by tick through Ray's log
tail, with a server restart (a fresh reader) in the middle, the stored log is Ray's log
to the character and every event is stored once."""

from __future__ import annotations

import shlex
import time

from sqlalchemy import select

from bench.harness.jobstore import job_service, set_columns, submit
from service.cluster.ray_backend import RayBackend
from service.db.event_models import MetricRow
from service.db.models import JobRow
from service.events import logs
from service.events.log_tails import READ_WHOLE_BELOW, LogTails

LINES = 6000
PRINTER = (
    "import json, sys, time\n"
    f"for i in range({LINES}):\n"
    "    print('x' * 200, i)\n"
    "    if i % 20 == 0:\n"
    "        print('RAYDOCK_EVENT ' + json.dumps({'type': 'metric', 'seq': i // 20, 'metrics': {'i': i}}))\n"
    "    if i % 1000 == 0:\n"
    "        sys.stdout.flush(); time.sleep(0.5)\n"
)


def test_a_long_log_is_read_in_pieces_across_a_restart_and_stored_whole(ray_head, tmp_path):
    backend = RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token())
    service = job_service(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    job_id = submit(service)
    sid = backend.jobs.submit_job(
        entrypoint=f"python -c {shlex.quote(PRINTER)}", runtime_env={"env_vars": {"PYTHONUNBUFFERED": "1"}}
    )
    set_columns(service, job_id, status="RUNNING", attempt=1, ray_job_id=sid)

    def offset() -> int:
        with service.sessions() as s:
            return s.get(JobRow, job_id).log_offset

    tails, reads, restarted = LogTails(backend, service.ingest), 0, False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ended = backend.state(sid).status in ("SUCCEEDED", "FAILED", "STOPPED")
        if tails.read(job_id, sid, offset(), ended) and ended:
            break
        reads += 1
        if not restarted and offset() > 0:  # the server restarts mid-job: a new reader skips what is stored
            tails.forget(set())
            tails, restarted = LogTails(backend, service.ingest), True
        time.sleep(0.3)
    assert [t.failures for t in tails._tails.values()] == [0]  # read through the tail, not by whole reads
    tails.forget(set())

    whole = backend.logs(sid)
    assert backend.state(sid).status == "SUCCEEDED"
    assert len(whole) > READ_WHOLE_BELOW and restarted and reads > 2
    with service.sessions() as s:
        assert logs.read(s, job_id, 0, max_chunks=10_000) == (whole, len(whole))
        seqs = s.scalars(select(MetricRow.src_seq).where(MetricRow.job_id == job_id).order_by(MetricRow.seq)).all()
    assert seqs == list(range(LINES // 20))
