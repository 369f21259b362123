"""Data-parallel extras: gradient accumulation and gradient compression."""

import pytest

from api.schemas import ParallelismSpec
from bench.harness.parallel import CFG, SEED, run_workers, train_specs_worker
from trainers.models.gpt import build_gpt

pytestmark = pytest.mark.slow  # process groups of torch workers

STEPS = 20


def test_grad_accumulation_equals_one_big_batch_and_syncs_once_per_step():
    specs = [
        ParallelismSpec(strategy="ddp"),
        ParallelismSpec(strategy="ddp", grad_accumulation_steps=4),
        ParallelismSpec(strategy="fsdp"),
        ParallelismSpec(strategy="fsdp", grad_accumulation_steps=4),
    ]
    ddp, ddp_k4, fsdp, fsdp_k4 = run_workers(train_specs_worker, 2, specs, STEPS)[0]
    n_params = build_gpt(CFG, seed=SEED).num_parameters()

    # 4 slices of 2 rows per worker == 1 batch of 8 rows per worker
    assert ddp_k4["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert fsdp_k4["losses"] == pytest.approx(fsdp["losses"], abs=1e-5)
    # one fp32 all-reduce of every gradient per optimizer step, not one per slice
    assert ddp["bytes"] == [n_params * 4] * STEPS
    assert ddp_k4["bytes"] == [n_params * 4] * STEPS
    assert fsdp_k4["bytes"] == fsdp["bytes"]


def test_gradient_compression_sends_fewer_bytes_and_still_trains():
    specs = [ParallelismSpec(grad_compression=c) for c in ("none", "bf16", "fp16", "powersgd")]
    plain, bf16, fp16, powersgd = run_workers(train_specs_worker, 2, specs, STEPS)[0]

    # 16-bit all-reduce: exactly half the bytes, loss within 5e-3 at every step
    for compressed in (bf16, fp16):
        assert compressed["bytes"] == [b // 2 for b in plain["bytes"]]
        assert compressed["losses"] == pytest.approx(plain["losses"], abs=5e-3)
    # PowerSGD: plain all-reduce for the first 2 syncs, then low-rank factors only
    assert powersgd["bytes"][:2] == plain["bytes"][:2]
    assert max(powersgd["bytes"][2:]) < plain["bytes"][-1] / 4
    # a biased compressor: it lags the exact run a little but keeps learning
    assert powersgd["losses"][-1] == pytest.approx(plain["losses"][-1], abs=0.2)
    assert powersgd["losses"][-1] < powersgd["losses"][0] - 0.5
