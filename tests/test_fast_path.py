"""The training fast path on CPU: compile keeps the loss curve, the step never reads the
device, reports come on their cadence, and the efficiency figures add up.

GPU speed itself is a benchmark (``bench/gpu_parity.py``), not a test.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from api.schemas import OptimizerSpec, ParallelismSpec
from bench.harness.parallel import run_workers
from trainers import efficiency, fast_path
from trainers.data.text import VOCAB_SIZE, batch_at, grammar_dataset
from trainers.models import CNN, MLP
from trainers.models.gpt import GPTConfig, build_gpt, lm_loss
from trainers.parallel import build_mesh, parallelize
from trainers.skeleton import build_optimizer

CPU = torch.device("cpu")
TINY_GPT = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=2, n_head=2, d_model=32, seq_len=16)
STEPS = 8


class HostReads(TorchDispatchMode):
    """Counts the operators that copy a tensor's value to the host.

    ``aten._local_scalar_dense`` is what ``.item()``, ``float(t)``, ``int(t)`` and
    ``bool(t)`` dispatch to; on CUDA each is a CPU-GPU sync point. Counting it needs no
    GPU, so the step's freedom from syncs is checked on every machine.
    """

    SYNCING = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCING:
            self.count += 1
        return func(*args, **(kwargs or {}))


def gpt_batches(steps: int = STEPS):
    ds = grammar_dataset(seq_len=TINY_GPT.seq_len, n_chars=16 * 1024, seed=0)
    return [batch_at(ds, i, 8, seed=0) for i in range(steps)]


def classifier_batches(steps: int = STEPS, side: int = 8):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, side * side, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(steps)]


def classification_loss(logits, y):
    return torch.nn.functional.cross_entropy(logits.float(), y)


def model_and_batches(kind: str):
    if kind == "gpt":
        return build_gpt(TINY_GPT, seed=0), lm_loss, gpt_batches()
    torch.manual_seed(0)
    return CNN(8, [4, 8], 4), classification_loss, classifier_batches()


def compile_curves_worker(rank, world_size, kind, strategy, precision, settings):
    """The loss curve of each ``parallelism.compile`` setting, trained as a job's loop does."""
    runs = []
    for setting in settings:
        spec = ParallelismSpec(strategy=strategy, precision=precision, compile=setting)
        model, loss_fn, batches = model_and_batches(kind)
        pm = parallelize(
            model, build_mesh(spec), spec, optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=3e-3), loss_fn=loss_fn
        )
        fast = fast_path.resolve(setting, pm.device, strategy=strategy, precision=precision)
        fast_path.accelerate(pm, fast)
        losses = [pm.train_step(x, y) for x, y in batches]
        runs.append({"compiled": fast.compile, "losses": losses, "names": sorted(pm.full_model_state_dict())})
    return runs


# ----------------------------------------------------------------------------- compile


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_compile_on_and_off_train_the_same_loss_curve(kind):
    off, on = run_workers(compile_curves_worker, 1, kind, "ddp", "fp32", ["off", "on"], timeout_s=600)[0]
    assert on["compiled"] and not off["compiled"]
    assert on["losses"] == pytest.approx(off["losses"], rel=1e-4, abs=1e-5)
    assert on["losses"][-1] < on["losses"][0]  # it trained
    # Compiled in place: checkpoints keep the plain model's parameter names.
    assert on["names"] == off["names"] and not any("_orig_mod" in n for n in on["names"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compiled_gpt_on_a_gpu_follows_the_eager_curve(strategy):
    off, on = run_workers(
        compile_curves_worker, 1, "gpt", strategy, "bf16", ["off", "auto"], backend="nccl", timeout_s=600
    )[0]
    assert on["compiled"] and not off["compiled"]
    assert on["losses"] == pytest.approx(off["losses"], abs=2e-2)  # bf16: kernels differ in rounding
    assert on["names"] == off["names"]


def test_compile_setting_resolves_per_device_and_strategy():
    cuda = torch.device("cuda", 0)
    assert fast_path.resolve("auto", CPU) == fast_path.FastPath(compile=False, tf32=False, prefetch=False)
    auto_gpu = fast_path.resolve("auto", cuda, strategy="fsdp", precision="fp32")
    assert auto_gpu == fast_path.FastPath(compile=True, tf32=True, prefetch=True)
    assert not fast_path.resolve("auto", cuda, strategy="pipeline").compile
    assert fast_path.resolve("on", cuda, strategy="pipeline").compile
    assert fast_path.resolve("on", CPU).compile
    assert not fast_path.resolve("on", cuda, strategy="parameter_server").compile
    off = fast_path.resolve("off", cuda, precision="fp32")
    assert not off.compile and not off.tf32  # off is the exact fp32 reference path
    assert not fast_path.resolve("auto", cuda, precision="bf16").tf32
    with pytest.raises(ValueError) as err:
        fast_path.resolve("sometimes", CPU)
    assert "parallelism.compile" in str(err.value)


def test_the_loops_optimizer_is_fused_exactly_when_every_parameter_is_on_a_gpu():
    # The one place the choice is made (fast_path.optimizer_options), used by the loops'
    # optimizer: a parameter server's shards build theirs on CPU actors, so the worker's
    # device cannot decide it.
    spec = OptimizerSpec(name="adamw", lr=1e-3)
    on_cpu = build_optimizer(spec, nn.Linear(2, 2).parameters())
    assert fast_path.optimizer_options(nn.Linear(2, 2).parameters()) == {}
    assert fast_path.optimizer_options([]) == {}
    assert not on_cpu.defaults.get("fused")
    if torch.cuda.is_available():
        on_gpu = build_optimizer(spec, nn.Linear(2, 2).cuda().parameters())
        assert fast_path.optimizer_options(nn.Linear(2, 2).cuda().parameters()) == {"fused": True}
        assert on_gpu.defaults["fused"] is True


# ----------------------------------------------------------------------------- no sync in the step


def host_reads_worker(rank, world_size, steps):
    """Host reads during ``steps`` local steps of the tiny GPT (the loop's step), then
    during the one ``mean_loss`` of the window."""
    spec = ParallelismSpec(strategy="ddp")
    # The optimizer the fast path builds on a GPU (fused; its CPU kernel exists too).
    # The unfused one reads its step counters on the host: CPU tensors, no sync on CUDA.
    options = {"fused": True}
    pm = parallelize(
        build_gpt(TINY_GPT, seed=0),
        build_mesh(spec),
        spec,
        optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=1e-3, **options),
    )
    batches = gpt_batches(steps)
    with HostReads() as in_steps:
        total = None
        for x, y in fast_path.prefetch(batches, pm.device):
            loss = pm.local_step(x, y)
            total = loss if total is None else total + loss
    with HostReads() as at_report:
        mean = pm.mean_loss(total / steps)
    return {"in_steps": in_steps.count, "at_report": at_report.count, "mean": mean}


def test_the_step_reads_nothing_from_the_device_and_the_report_reads_once():
    r = run_workers(host_reads_worker, 1, 4, timeout_s=300)[0]
    assert r["in_steps"] == 0
    assert r["at_report"] == 1 and math.isfinite(r["mean"])


def test_the_host_read_counter_sees_item():
    with HostReads() as reads:
        torch.ones(3).sum().item()
        bool(torch.ones(1) > 0)
    assert reads.count == 2  # the counter is able to fail the test above


# ----------------------------------------------------------------------------- prefetch


def test_prefetch_yields_every_batch_in_order_on_the_device():
    batches = classifier_batches(5)
    out = list(fast_path.prefetch(iter(batches), CPU))
    assert len(out) == 5
    for (x, y), (px, py) in zip(batches, out):
        assert torch.equal(x, px) and torch.equal(y, py) and px.device == CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefetch_on_cuda_copies_pinned_batches_and_reraises_errors():
    batches = classifier_batches(6)
    out = list(fast_path.prefetch(iter(batches), torch.device("cuda")))
    assert [torch.equal(x.cpu(), b[0]) for (x, _), b in zip(out, batches)] == [True] * 6

    def broken():
        yield batches[0]
        raise RuntimeError("bad shard")

    it = fast_path.prefetch(broken(), torch.device("cuda"))
    next(it)
    with pytest.raises(RuntimeError) as err:
        next(it)
    assert "bad shard" in str(err.value)


# ----------------------------------------------------------------------------- efficiency


def test_gpt_flops_per_token_follow_6n_plus_attention():
    cfg = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=12, n_head=12, d_model=768, seq_len=1024)
    model = build_gpt(cfg, seed=0)
    embeddings = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    n = efficiency.gpt_matmul_parameters(n_layer=12, d_model=768, vocab_size=VOCAB_SIZE)
    assert n == model.num_parameters() - embeddings  # every parameter but the lookup tables
    fpt = efficiency.gpt_flops_per_token(n_layer=12, d_model=768, seq_len=1024, vocab_size=VOCAB_SIZE)
    assert fpt == 6 * n + 12 * 12 * 768 * 1024
    assert 6.0e8 < fpt < 6.5e8  # ~85M matmul parameters: ~0.51 GFLOP, plus attention's 0.11


def test_flops_per_sample_counts_the_forward_three_times():
    mlp = MLP(64, [32], 4)
    # Two matrix products per sample: 64x32 and 32x4, 2 FLOPs per multiply-add.
    assert efficiency.flops_per_sample(mlp, torch.randn(8, 64)) == 3 * 2 * (64 * 32 + 32 * 4)


def test_efficiency_metrics_on_cpu_give_flops_but_no_mfu_or_gpu_memory():
    metrics = efficiency.efficiency_metrics(
        unit="token", items_per_s=1000.0, flops_per_item=6000, device=CPU, precision="fp32", n_devices=2
    )
    assert metrics == {"flops_per_token": 6000}
    assert efficiency.device_peak_flops(CPU, "bf16") is None


def test_mfu_is_achieved_over_peak_of_every_device():
    # 585,552 tokens/s of the 86M GPT on one H100 (issue 14): ~0.35-0.37 of 989 TFLOP/s.
    fpt = efficiency.gpt_flops_per_token(n_layer=12, d_model=768, seq_len=1024, vocab_size=VOCAB_SIZE)
    mfu = efficiency.model_flops_utilisation(585_552, fpt, 989e12, 1)
    assert 0.33 < mfu < 0.37
    assert efficiency.model_flops_utilisation(585_552, fpt, 989e12, 2) == pytest.approx(mfu / 2)
    assert efficiency.model_flops_utilisation(1.0, fpt, None, 1) is None


def test_peak_table_matches_the_most_specific_name_first():
    names = {pattern for pattern, _ in efficiency.PEAK_TFLOPS}
    assert {"H100", "H100 PCIe", "H200", "A100", "A10", "L4", "L40S"} <= names
    order = [p for p, _ in efficiency.PEAK_TFLOPS]
    for i, pattern in enumerate(order):
        # No pattern may be shadowed by a shorter one listed before it.
        assert not any(earlier in pattern for earlier in order[:i]), pattern


# ----------------------------------------------------------------------------- a real job


def test_gpt_job_reports_on_its_step_cadence_with_efficiency_metrics(client):
    """A GPT job with ``report.every_n_steps: 3`` reports at steps 3, 6, 9 of one long
    epoch, each with its throughput and FLOPs per token (no MFU or GPU memory on CPU)."""
    spec = {
        "name": "cadence",
        "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "d_model": 16, "seq_len": 16},
        "data": {"source": "text", "n_chars": 64 * 1024, "val_batches": 1},
        "batch_size": 8,
        "max_steps": 9,
        "scaling": {"num_workers": 1},
        "report": {"every_n_steps": 3, "every_s": 3600},
    }
    job = client.submit(spec).wait(timeout=300)
    assert job.status == "SUCCEEDED", job.info
    points = job.metrics()
    assert [p.metrics["step"] for p in points] == [3, 6, 9]
    fpt = efficiency.gpt_flops_per_token(n_layer=1, d_model=16, seq_len=16, vocab_size=VOCAB_SIZE)
    for p in points:
        assert p.metrics["flops_per_token"] == fpt
        assert p.metrics["tokens_per_s"] > 0 and math.isfinite(p.metrics["train_loss"])
        assert "mfu" not in p.metrics and "gpu_mem_allocated_peak_bytes" not in p.metrics
