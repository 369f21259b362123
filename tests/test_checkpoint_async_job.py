"""A GPT job whose checkpoints upload behind training (``checkpoint.upload: async``) on
the session's Ray cluster: it ends SUCCEEDED with every report in order, each checkpoint
it lists is sealed by its manifest, and the latest one holds the weights of the last
reported validation loss."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pyarrow.fs as pafs
import pytest

from api.checkpoint_manifest import MANIFEST_FILE, complete
from tests.test_strategies_jobs import REPORT_EVERY, STEPS, checkpoint_val_loss, gpt_spec, run_job
from trainers.checkpoint_writer import listing

pytestmark = pytest.mark.slow


def test_an_async_checkpoint_job_lists_only_sealed_checkpoints_and_resumes_its_weights(server, tmp_path):
    http = httpx.Client(base_url=server.url, timeout=30)
    spec = gpt_spec("gpt-async-checkpoints", {"strategy": "ddp"})
    spec["checkpoint"] = {"every_n_steps": REPORT_EVERY, "keep": 2, "upload": "async"}
    job, series = run_job(http, spec)
    listed = http.get(f"/v1/jobs/{job['id']}/checkpoints").json()

    assert [m["step"] for m in series] == list(range(REPORT_EVERY, STEPS + 1, REPORT_EVERY))
    assert [c["step"] for c in listed] == [STEPS - REPORT_EVERY, STEPS]  # keep 2, the latest last
    for c in listed:
        files = listing(pafs.LocalFileSystem(), c["path"])
        manifest = (Path(c["path"]) / MANIFEST_FILE).read_bytes()
        assert complete(files, manifest), c["path"]
        assert set(json.loads(manifest)["files"]) == set(files) - {MANIFEST_FILE}
    assert checkpoint_val_loss(http, job, tmp_path, 2) == pytest.approx(series[-1]["val_loss"], abs=1e-4)
