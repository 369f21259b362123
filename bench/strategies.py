"""Parallelism strategies side by side on one GPT: step time, memory, bytes moved.

    .venv/bin/python -m bench.strategies            # BENCH_STEPS=20 timed steps by default

Every strategy trains the same GPT (same seed, same global batch) on 2 processes joined
by gloo, run with ``torch.distributed`` directly (``harness/parallel``),
no Ray: what is measured is the strategy, not the job service. Each strategy gets fresh
processes so memory figures do not carry over. Per strategy, on rank 0:

- ``step ms``: median wall time of a training step, after warm-up steps;
- ``peak RSS MB``: growth of the process's peak resident memory over its baseline
  (torch imported, nothing built) while building the model and training;
- ``state MB``: parameter + optimizer-state bytes this worker holds (``local_state_bytes``);
- ``grad-sync MB/step``: gradient bytes sent for averaging, as the strategy counts them
  (``bytes_communicated``: DDP's hook, FSDP's reduce-scatter input, the data-axis all-reduce);
- ``all comms MB/step``: every tensor this rank hands to a gloo collective or send in one
  step (gradients, activations, parameter all-gathers), from the torch profiler;
- ``loss``: the training loss after the timed steps (every row should agree closely).

Then gradient compression's byte ratio against plain DDP, counted in the hook. With a
GPU (``torch.cuda.is_available()``): tokens/s and MFU of a larger GPT on one GPU under
bf16 autocast.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from api.schemas import ParallelismSpec
from bench.harness.parallel import run_workers
from trainers.data.text import VOCAB_SIZE, batch_at, grammar_dataset
from trainers.models.gpt import GPTConfig, build_gpt
from trainers.parallel import build_mesh, parallelize

CFG = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=4, n_head=4, d_model=128, seq_len=64)
GLOBAL_BATCH = 16
WARMUP = 3
STEPS = int(os.environ.get("BENCH_STEPS", "20"))
MB = 1e6

STRATEGIES = [
    ("ddp", ParallelismSpec(strategy="ddp")),
    ("ddp accum 4", ParallelismSpec(strategy="ddp", grad_accumulation_steps=4)),
    ("fsdp", ParallelismSpec(strategy="fsdp")),
    ("tensor 2", ParallelismSpec(strategy="tensor", tensor_degree=2)),
    ("pipeline 2 gpipe", ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 4, "schedule": "gpipe"})),
    ("pipeline 2 1f1b", ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 4, "schedule": "1f1b"})),
    ("ddp bf16 autocast", ParallelismSpec(strategy="ddp", precision="bf16")),
]
COMPRESSIONS = ["none", "bf16", "fp16", "powersgd"]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> None:
    # Linux: writing 5 resets VmHWM (the peak RSS) to the current RSS.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _element_size(dtype: str) -> int:
    if "BFloat16" in dtype or "Half" in dtype:
        return 2
    if "double" in dtype or "long" in dtype:
        return 8
    return 4


def _comm_bytes(prof) -> int:
    """Bytes of the tensors handed to gloo collectives and sends (not receives)."""
    total = 0
    for e in prof.events():
        if not e.name.startswith("gloo:") or e.name == "gloo:recv":
            continue
        for shape, dtype in zip(e.input_shapes or [], e.input_dtypes or []):
            numel = 1
            for d in shape:
                numel *= d
            total += numel * _element_size(str(dtype))
    return total


def strategy_worker(rank: int, world_size: int, spec: ParallelismSpec) -> dict:
    _reset_peak_rss()
    baseline_kb = _status_kb("VmRSS")
    pm = parallelize(
        build_gpt(CFG, seed=0),
        build_mesh(spec),
        spec,
        optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=3e-3),
    )
    ds = grammar_dataset(seq_len=CFG.seq_len, n_chars=256 * 1024, seed=0)
    per_rank = GLOBAL_BATCH // pm.data_world_size

    def step(i: int) -> float:
        x, y = batch_at(ds, i, per_rank, rank=pm.data_rank, world_size=pm.data_world_size)
        return pm.train_step(x, y)

    for i in range(WARMUP):
        step(i)
    sync_before = pm.bytes_communicated
    times, loss = [], 0.0
    for i in range(WARMUP, WARMUP + STEPS):
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
    sync_per_step = (pm.bytes_communicated - sync_before) / STEPS
    # A separate, untimed step under the profiler (it slows what it records).
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(WARMUP + STEPS)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "peak_rss_mb": (_status_kb("VmHWM") - baseline_kb) * 1024 / MB,
        "state_mb": pm.local_state_bytes() / MB,
        "sync_mb": sync_per_step / MB,
        "comm_mb": _comm_bytes(prof) / MB,
        "loss": loss,
    }


def compression_worker(rank: int, world_size: int) -> dict:
    sent = {}
    ds = grammar_dataset(seq_len=CFG.seq_len, n_chars=256 * 1024, seed=0)
    for method in COMPRESSIONS:
        spec = ParallelismSpec(strategy="ddp", grad_compression=method)
        pm = parallelize(
            build_gpt(CFG, seed=0),
            build_mesh(spec),
            spec,
            optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=3e-3),
        )
        # PowerSGD sends plain gradients for its first steps; count after those.
        for i in range(WARMUP):
            pm.train_step(*batch_at(ds, i, GLOBAL_BATCH // 2, rank=rank, world_size=2))
        before = pm.bytes_communicated
        for i in range(WARMUP, WARMUP + 5):
            loss = pm.train_step(*batch_at(ds, i, GLOBAL_BATCH // 2, rank=rank, world_size=2))
        sent[method] = ((pm.bytes_communicated - before) / 5, loss)
    return sent


def gpu_throughput() -> None:
    """Tokens/s and model FLOPs utilisation of a GPT-2-small-sized model on one GPU."""
    cfg = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=12, n_head=12, d_model=768, seq_len=1024)
    batch, steps = 16, 20
    model = build_gpt(cfg, seed=0).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    compiled = torch.compile(model)
    x = torch.randint(0, VOCAB_SIZE, (batch, cfg.seq_len), device="cuda")
    y = torch.randint(0, VOCAB_SIZE, (batch, cfg.seq_len), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()  # a CPU-GPU sync point: the timer needs the work done
    seconds = time.perf_counter() - t0
    tokens_per_s = batch * cfg.seq_len * steps / seconds
    # 6 FLOPs per parameter per token (forward + backward) plus attention's 12*L*d*T.
    n_params = model.num_parameters()
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len
    name = torch.cuda.get_device_name()
    # Dense bf16 peak FLOP/s by device; MFU is left out for devices not listed.
    peaks = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}
    peak = next((v for k, v in peaks.items() if k in name), None)
    print(f"\nOne GPU ({name}), GPT {n_params / 1e6:.0f}M params, batch {batch} x {cfg.seq_len}, bf16, compiled:")
    print(f"  tokens/s {tokens_per_s:,.0f}   peak memory {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")
    if peak:
        print(f"  MFU {tokens_per_s * flops_per_token / peak:.1%} of {peak / 1e12:.0f} TFLOP/s")


def main() -> None:
    torch.set_num_threads(1)
    model = build_gpt(CFG, seed=0)
    print(
        f"GPT {model.num_parameters() / 1e6:.2f}M params ({CFG.n_layer} layers, d_model "
        f"{CFG.d_model}, {CFG.n_head} heads, seq {CFG.seq_len}), global batch {GLOBAL_BATCH}, "
        f"2 processes on gloo, {STEPS} timed steps; figures of rank 0\n"
    )
    header = f"{'strategy':<19}{'step ms':>9}{'peak RSS MB':>13}{'state MB':>10}{'grad-sync MB/step':>19}{'all comms MB/step':>19}{'loss':>8}"
    print(header)
    print("-" * len(header))
    for name, spec in STRATEGIES:
        r = run_workers(strategy_worker, 2, spec, timeout_s=600)[0]
        print(
            f"{name:<19}{r['step_ms']:>9.1f}{r['peak_rss_mb']:>13.1f}{r['state_mb']:>10.2f}"
            f"{r['sync_mb']:>19.3f}{r['comm_mb']:>19.3f}{r['loss']:>8.4f}",
            flush=True,
        )

    sent = run_workers(compression_worker, 2, timeout_s=600)[0]
    plain = sent["none"][0]
    print(f"\nDDP gradient compression (bytes sent per step by rank 0, after {WARMUP} warm-up steps)")
    print(f"{'compression':<13}{'MB/step':>9}{'vs none':>9}{'loss':>8}")
    for method, (per_step, loss) in sent.items():
        print(f"{method:<13}{per_step / MB:>9.3f}{per_step / plain:>9.3f}{loss:>8.4f}")

    if torch.cuda.is_available():
        gpu_throughput()
    else:
        print("\nNo GPU: tokens/s and MFU on one GPU skipped.")


if __name__ == "__main__":
    main()
