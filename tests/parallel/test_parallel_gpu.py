"""Paths that only exist on GPUs: fp16 loss scaling, bf16 on CUDA, NCCL collectives.

Skipped on machines without CUDA (and the multi-GPU test without 2 GPUs).
"""

import pytest
import torch

from api.schemas import ParallelismSpec
from bench.harness.parallel import reference_run, run_workers, train_specs_worker

STEPS = 20

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS)


@needs_gpu
def test_fp16_with_loss_scaling_and_bf16_train_close_to_fp32_on_one_gpu(reference):
    specs = [ParallelismSpec(precision="fp16"), ParallelismSpec(precision="bf16")]
    fp16, bf16 = run_workers(train_specs_worker, 1, specs, STEPS, backend="nccl")[0]
    assert fp16["losses"] == pytest.approx(reference["losses"], abs=1e-2)
    assert bf16["losses"] == pytest.approx(reference["losses"], abs=1e-2)


@needs_two_gpus
def test_ddp_and_fsdp_over_nccl_match_single_process(reference):
    specs = [ParallelismSpec(strategy="ddp"), ParallelismSpec(strategy="fsdp")]
    ddp, fsdp = run_workers(train_specs_worker, 2, specs, STEPS, backend="nccl")[0]
    assert ddp["losses"] == pytest.approx(reference["losses"], abs=1e-4)
    assert fsdp["losses"] == pytest.approx(reference["losses"], abs=1e-4)
