"""Every parallelism strategy as a job through the REST API, and the 422s for bad input.

Each job trains a tiny GPT (or the digits MLP: fsdp, parameter server) for a few dozen steps on the session's
Ray cluster and must end SUCCEEDED with its loss falling. The checkpoint it leaves
must hold plain weights that reproduce the reported validation loss in this process,
whatever the layout the strategy trained in (sharded, split by heads, cut in stages).
"""

from __future__ import annotations

import subprocess

import httpx
import pytest
import torch

from api.schemas import GPTModel, TextData
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from tests.support.specs import user_spec
from trainers.data.text import batch_at, grammar_dataset
from trainers.lm_loop import gpt_config
from trainers.models.gpt import build_gpt, lm_loss

GPT = {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16}
TEXT = {"source": "text", "n_chars": 16 * 1024, "val_batches": 2}
STEPS, REPORT_EVERY = 24, 8


def gpt_spec(name: str, parallelism: dict, **overrides) -> dict:
    spec = {
        "name": name,
        "model": GPT,
        "data": TEXT,
        "optimizer": {"name": "adamw", "lr": 3e-3},
        "batch_size": 8,
        "max_steps": STEPS,
        "seed": 0,
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": REPORT_EVERY, "keep": 1},
        "parallelism": parallelism,
    }
    spec.update(overrides)
    return spec


def run_job(http: httpx.Client, spec: dict) -> tuple[dict, list[dict]]:
    r = http.post("/v1/jobs", json=spec)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = wait_for(
        lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["status"] in ("SUCCEEDED", "FAILED") and j,
        240,
        f"job {spec['name']} to end",
    )
    assert job["status"] == "SUCCEEDED", job.get("error")
    return job, [p["metrics"] for p in http.get(f"/v1/jobs/{job_id}/metrics").json()]


def checkpoint_val_loss(http: httpx.Client, job: dict, tmp_path, data_replicas: int) -> float:
    """The validation loss of the latest checkpoint's plain weights, computed here."""
    latest = http.get(f"/v1/jobs/{job['id']}/checkpoints").json()[-1]
    archive = http.get(f"/v1/jobs/{job['id']}/checkpoints/{latest['id']}/download")
    assert archive.status_code == 200
    (tmp_path / "ckpt.tar.gz").write_bytes(archive.content)
    subprocess.run(["tar", "xzf", "ckpt.tar.gz"], cwd=tmp_path, check=True)
    spec = job["spec"]
    model = build_gpt(gpt_config(GPTModel(**spec["model"])), seed=1)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))
    text = TextData(**spec["data"])
    val = grammar_dataset(seq_len=model.config.seq_len, n_chars=text.n_chars, seed=spec["seed"], split="val")
    global_batch = spec["batch_size"] * data_replicas
    with torch.no_grad():
        losses = [
            lm_loss(model(x), y).item()
            for x, y in (batch_at(val, i, global_batch, seed=spec["seed"]) for i in range(text.val_batches))
        ]
    return sum(losses) / len(losses)


STRATEGIES = [
    # (id, parallelism, workers, data replicas, does gradient sync cross workers)
    (
        "ddp-accumulation-bf16-compression",
        {"strategy": "ddp", "grad_accumulation_steps": 2, "grad_compression": "bf16"},
        2,
        2,
        True,
    ),
    # fsdp and tensor are opt-in here (`long`): the digits FSDP job below and the hybrid mesh
    # (data x tensor) run them on the cluster by default, and tests/parallel checks both.
    pytest.param("fsdp", {"strategy": "fsdp"}, 2, 2, True, marks=pytest.mark.long, id="fsdp"),
    pytest.param(
        "tensor", {"strategy": "tensor", "tensor_degree": 2}, 2, 1, False, marks=pytest.mark.long, id="tensor"
    ),
    pytest.param(
        "pipeline-gpipe",
        {"strategy": "pipeline", "pipeline": {"stages": 2, "microbatches": 2, "schedule": "gpipe"}},
        2,
        1,
        False,
        id="pipeline-gpipe",
    ),
    ("hybrid-data2-tensor2", {"strategy": "hybrid", "mesh": {"data": 2, "tensor": 2}}, 4, 2, True),
]


@pytest.mark.parametrize(
    "what,parallelism,workers,replicas,syncs",
    STRATEGIES,
    ids=[s[0] if isinstance(s, tuple) else s.id for s in STRATEGIES],
)
def test_strategy_job_trains_and_its_checkpoint_reproduces_val_loss(
    server, tmp_path, what, parallelism, workers, replicas, syncs
):
    http = httpx.Client(base_url=server.url, timeout=30)
    job, series = run_job(http, gpt_spec(f"gpt-{what}", parallelism, scaling={"num_workers": workers}))

    assert [m["step"] for m in series] == list(range(REPORT_EVERY, STEPS + 1, REPORT_EVERY))
    assert series[-1]["train_loss"] < series[0]["train_loss"] - 0.2
    assert series[-1]["val_loss"] < series[0]["val_loss"]
    assert all(m["tokens_per_s"] > 0 and m["local_state_bytes"] > 0 for m in series)
    # Only data replicas exchange gradients; a tensor group or a pipeline of one
    # replica moves activations instead, which this counter does not include.
    assert (series[-1]["bytes_communicated"] > 0) == syncs
    assert checkpoint_val_loss(http, job, tmp_path, replicas) == pytest.approx(series[-1]["val_loss"], abs=1e-4)


def test_digits_mlp_with_fsdp_and_accumulation_learns(server):
    http = httpx.Client(base_url=server.url, timeout=30)
    spec = digits_spec(name="digits-fsdp", epochs=4, parallelism={"strategy": "fsdp", "grad_accumulation_steps": 2})
    _, series = run_job(http, spec)
    assert [m["epoch"] for m in series] == [1, 2, 3, 4]
    assert series[-1]["train_loss"] < series[0]["train_loss"]
    assert series[-1]["val_acc"] >= 0.9


def test_digits_mlp_with_async_parameter_server_learns_within_the_staleness_bound(server):
    http = httpx.Client(base_url=server.url, timeout=30)
    parallelism = {
        "strategy": "parameter_server",
        "parameter_server": {"num_servers": 2, "mode": "async", "staleness": 1},
    }
    schedule = {
        "unit": "epoch",
        "intervals": [{"at": 0, "values": {"optimizer.lr": 0.01}}, {"at": 2, "values": {"optimizer.lr": 0.004}}],
    }
    spec = digits_spec(name="digits-ps", epochs=4, batch_size=32, parallelism=parallelism, schedule=schedule)
    _, series = run_job(http, spec)
    assert [m["epoch"] for m in series] == [1, 2, 3, 4]
    assert series[-1]["val_acc"] >= 0.9
    # The servers step with the schedule's lr, not only the workers' copies of it.
    assert [m["server_lr"] for m in series] == pytest.approx([0.01, 0.01, 0.004, 0.004])
    # No worker pushed while more than 1 step ahead of the slowest.
    assert max(m["max_ahead"] for m in series) <= 1
    # Async: one server update per pushed gradient, from each of the 2 workers.
    assert series[-1]["server_version"] == 2 * series[-1]["step"]


def bad_gpt(parallelism: dict, **overrides) -> dict:
    return gpt_spec("bad", parallelism, **overrides)


BAD = [
    (
        "more stages than layers",
        bad_gpt({"strategy": "pipeline", "pipeline": {"stages": 2, "microbatches": 2}}, model={**GPT, "n_layer": 1}),
        "parallelism.pipeline.stages",
    ),
    (
        "tensor degree not dividing heads",
        bad_gpt({"strategy": "tensor", "tensor_degree": 2}, model={**GPT, "n_head": 3, "d_model": 48}),
        "parallelism.tensor_degree",
    ),
    (
        "mesh product is not num_workers",
        bad_gpt({"strategy": "hybrid", "mesh": {"data": 2, "tensor": 2}}),
        "parallelism.mesh",
    ),
    ("fp16 without a GPU", bad_gpt({"strategy": "ddp", "precision": "fp16"}), "parallelism.precision"),
    (
        "user code with tensor",
        user_spec("userpkg.steps:train", parallelism={"strategy": "tensor"}),
        "parallelism.strategy",
    ),
    ("mlp with pipeline", digits_spec(parallelism={"strategy": "pipeline"}), "parallelism.strategy"),
    ("parameter server for the gpt", bad_gpt({"strategy": "parameter_server"}), "parallelism.strategy"),
    (
        "staleness in sync mode",
        digits_spec(parallelism={"strategy": "parameter_server", "parameter_server": {"mode": "sync", "staleness": 2}}),
        "parallelism.parameter_server.staleness",
    ),
    (
        "microbatches not dividing the batch",
        bad_gpt({"strategy": "pipeline", "pipeline": {"microbatches": 3, "schedule": "gpipe"}}),
        "parallelism.pipeline.microbatches",
    ),
    (
        "accumulation not dividing the batch",
        bad_gpt({"strategy": "ddp", "grad_accumulation_steps": 3}),
        "parallelism.grad_accumulation_steps",
    ),
    (
        "compression outside ddp",
        bad_gpt({"strategy": "fsdp", "grad_compression": "powersgd"}),
        "parallelism.grad_compression",
    ),
    ("gpt on digits", bad_gpt({}, data={"source": "digits"}), "data.source"),
    ("heads not dividing the width", bad_gpt({}, model={**GPT, "n_head": 3}), "model.d_model"),
    ("corpus smaller than a batch", bad_gpt({}, data={"source": "text", "n_chars": 2048}), "data.n_chars"),
]


@pytest.mark.parametrize("what,body,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_parallelism_is_refused_with_the_field_to_change(server, what, body, hint):
    http = httpx.Client(base_url=server.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_spec"
    assert hint in err["message"]
    assert http.get("/v1/jobs").json()["total"] == before
