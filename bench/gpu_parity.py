"""The built-in loops against the same model trained by hand, side by side on one device.

    python -m bench.gpu_parity                         # every workload for this machine
    python -m bench.gpu_parity --models gpt86m,cnn     # a subset
    python -m bench.gpu_parity --json out.json         # also write every figure

For each workload the same model, batch and precision is trained twice on the same
device, one after the other in this run:

- **direct**: a hand-written loop in this process, written the way a careful user would
  (``torch.compile`` on CUDA, fused AdamW, autocast, batches already on the device);
- **job**: a raydock job (one worker) submitted over REST to a server on a local Ray
  head, the built-in model's loop doing the work; its throughput is the median of the
  ``tokens_per_s`` / ``samples_per_s`` it reports after its first report (which holds
  the compile), and ``wall`` the same measured from the reports' timestamps, report
  and evaluation time included.

Prints tokens/s (samples/s for the CNN), MFU against the device's dense peak
(``trainers.efficiency``) and the ratio job/direct; the goal is >= 0.95 for every row.
On a GPU: the GPT at 86M (12 x 768, 12 heads, seq 1024, batch 16, bf16) and ~300M
(24 x 1024, 16 heads), and the CNN (28 x 28 inputs, channels 64/128, batch 2048, bf16).
On CPU the same comparison runs small (tiny GPT and CNN, fp32, one thread, gloo) so the
ratio is tracked on every machine; compile is then off on both sides, as ``auto`` gives.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch

from bench.jobs import run_job
from trainers import efficiency
from trainers.data.tabular import load_arrays
from trainers.data.text import VOCAB_SIZE, batch_at, grammar_dataset
from trainers.models import build_model
from trainers.models.gpt import GPTConfig, build_gpt, lm_loss

CUDA = torch.cuda.is_available()


@dataclass
class Workload:
    name: str
    model: dict
    data: dict
    batch_size: int
    precision: str
    steps: int  # job steps (direct: warm-up + timed steps of the same count)
    report_every: int
    params: int = 0
    flops_per_item: int = 0
    unit: str = "token"


def gpt(
    name: str, n_layer: int, d_model: int, n_head: int, seq_len: int, batch: int, precision: str, steps: int, every: int
) -> Workload:
    # Enough characters for the whole run in one epoch: no epoch-end report mid-window.
    n_chars = int((steps + 8) * batch * seq_len / 0.88)
    return Workload(
        name,
        {"type": "gpt", "n_layer": n_layer, "n_head": n_head, "d_model": d_model, "seq_len": seq_len},
        {"source": "text", "n_chars": max(n_chars, 64 * 1024), "val_batches": 1},
        batch,
        precision,
        steps,
        every,
    )


def cnn(name: str, data: dict, channels: list[int], batch: int, precision: str, steps: int, every: int) -> Workload:
    return Workload(name, {"type": "cnn", "channels": channels}, data, batch, precision, steps, every, unit="sample")


WORKLOADS_GPU = {
    "gpt86m": gpt("gpt86m", 12, 768, 12, 1024, 16, "bf16", 160, 20),
    "gpt300m": gpt("gpt300m", 24, 1024, 16, 1024, 16, "bf16", 100, 20),
    "cnn": cnn(
        "cnn",
        {"source": "synthetic", "n_samples": 131072, "n_features": 784, "n_classes": 10},
        [64, 128],
        2048,
        "bf16",
        200,
        25,
    ),
}
WORKLOADS_CPU = {
    "gpt-tiny": gpt("gpt-tiny", 2, 64, 2, 64, 16, "fp32", 120, 20),
    "cnn-tiny": cnn("cnn-tiny", {"source": "digits"}, [16, 32], 64, "fp32", 120, 20),
}


@dataclass
class Figures:
    items_per_s: float
    mfu: float | None = None
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- direct


def _autocast(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def _time_steps(step, batches: list, warmup: int, timed: int, device: torch.device) -> float:
    for i in range(warmup):
        step(*batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(timed):
        step(*batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()  # a CPU-GPU sync point: the timer needs the work done
    return time.perf_counter() - t0


def direct(w: Workload, device: torch.device) -> Figures:
    """The hand-written loop: what a user gets from the same model without raydock."""
    torch.manual_seed(0)
    if device.type == "cuda" and w.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if w.model["type"] == "gpt":
        cfg = GPTConfig(vocab_size=VOCAB_SIZE, **{k: v for k, v in w.model.items() if k != "type"})
        model = build_gpt(cfg, seed=0)
        ds = grammar_dataset(
            seq_len=cfg.seq_len, n_chars=min(w.data["n_chars"], 8 * w.batch_size * cfg.seq_len * 2), seed=0
        )
        batches = [batch_at(ds, i, w.batch_size) for i in range(8)]
        loss_fn = lm_loss
        items_per_step = w.batch_size * cfg.seq_len
    else:
        arrays = load_arrays(_data_spec(w.data), 0)
        model = build_model(_model_spec(w.model), arrays.n_features, arrays.n_classes)
        n = len(arrays.x_train) // w.batch_size * w.batch_size
        batches = list(zip(arrays.x_train[:n].split(w.batch_size), arrays.y_train[:n].split(w.batch_size)))[:8]
        loss_fn = lambda logits, y: torch.nn.functional.cross_entropy(logits.float(), y)  # noqa: E731
        items_per_step = w.batch_size
    w.params = sum(p.numel() for p in model.parameters())
    w.flops_per_item = _flops_per_item(w, model, batches[0][0])
    model = model.to(device)
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, **({"fused": True} if device.type == "cuda" else {}))
    fwd = torch.compile(model) if device.type == "cuda" else model

    def step(x, y, fwd=fwd, opt=opt):
        with _autocast(w.precision, device):
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    warmup, timed = 10, max(w.steps - 10, 10)
    seconds = _time_steps(step, batches, warmup, timed, device)
    rate = timed * items_per_step / seconds
    mem = efficiency.gpu_memory_peaks(device)
    del model, opt, fwd, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    peak = efficiency.device_peak_flops(device, w.precision)
    return Figures(rate, efficiency.model_flops_utilisation(rate, w.flops_per_item, peak, 1), mem)


def _flops_per_item(w: Workload, model: torch.nn.Module, example: torch.Tensor) -> int:
    if w.model["type"] == "gpt":
        m = w.model
        return efficiency.gpt_flops_per_token(
            n_layer=m["n_layer"], d_model=m["d_model"], seq_len=m["seq_len"], vocab_size=VOCAB_SIZE
        )
    return efficiency.flops_per_sample(model, example[:2])


def _data_spec(d: dict):
    from api.schemas import DigitsData, SyntheticData

    return DigitsData(**d) if d["source"] == "digits" else SyntheticData(**d)


def _model_spec(m: dict):
    from api.schemas import CNNModel

    return CNNModel(**m)


# ----------------------------------------------------------------------------- job


def job_spec(w: Workload, *, checkpoint_every: int | None) -> dict:
    spec = {
        "name": f"parity-{w.name}",
        "model": w.model,
        "data": w.data,
        "optimizer": {"name": "adamw", "lr": 3e-4},
        "batch_size": w.batch_size,
        "max_steps": w.steps,
        "seed": 0,
        "scaling": {"num_workers": 1, "use_gpu": CUDA, "cpus_per_worker": 4 if CUDA else 1},
        "parallelism": {"strategy": "ddp", "precision": w.precision},
        "report": {"every_n_steps": w.report_every, "every_s": 3600},
    }
    if checkpoint_every:
        spec["checkpoint"] = {"every_n_steps": checkpoint_every}
    return spec


def job(w: Workload, http: httpx.Client, device: torch.device, *, checkpoint_every: int | None) -> Figures:
    run = run_job(http, job_spec(w, checkpoint_every=checkpoint_every), poll_s=0.2)
    points = run.points
    key = "tokens_per_s" if w.unit == "token" else "samples_per_s"
    steady = [p for p in points[1:] if p["metrics"].get(key)]  # the first window holds the compile
    if not steady:
        raise RuntimeError(f"{w.name}: the job reported fewer than two windows: {points}")
    rate = statistics.median(p["metrics"][key] for p in steady)
    per_step = w.batch_size * (w.model["seq_len"] if w.unit == "token" else 1)
    a, b = points[0], points[-1]
    wall = (b["metrics"]["step"] - a["metrics"]["step"]) * per_step / max(b["ts"] - a["ts"], 1e-9)
    last = points[-1]["metrics"]
    peak = efficiency.device_peak_flops(device, w.precision)
    return Figures(
        rate,
        efficiency.model_flops_utilisation(rate, w.flops_per_item, peak, 1),
        {
            "wall_items_per_s": wall,
            "first_metric_s": run.first_metric_s,
            "total_s": run.wall_s,
            "reports": len(points),
            "job_mfu": last.get("mfu"),
            "job_flops_per_item": last.get(f"flops_per_{w.unit}"),
            "gpu_mem_allocated_peak_bytes": last.get("gpu_mem_allocated_peak_bytes"),
            "train_loss": last.get("train_loss"),
        },
    )


# ----------------------------------------------------------------------------- main


def main() -> int:
    table = WORKLOADS_GPU if CUDA else WORKLOADS_CPU
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(table), help=f"comma-separated, of {', '.join(table)}")
    ap.add_argument("--skip-job", action="store_true", help="direct runs only")
    ap.add_argument("--checkpoint-every", type=int, default=None, help="also checkpoint the jobs every N steps")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args()
    workloads = [table[m] for m in args.models.split(",")]
    device = torch.device("cuda") if CUDA else torch.device("cpu")
    if not CUDA:
        torch.set_num_threads(1)  # as the job's worker (cpus_per_worker 1)
    name = torch.cuda.get_device_name() if CUDA else "CPU"
    print(f"device: {name}; torch {torch.__version__}", flush=True)

    results: dict[str, dict] = {}
    for w in workloads:
        d = direct(w, device)
        results[w.name] = {"direct": asdict(d)}
        print(f"direct {w.name}: {d.items_per_s:,.0f} {w.unit}s/s  mfu {d.mfu}  {d.extra}", flush=True)
    if not args.skip_job:
        from bench.harness.servers import ServerProcess
        from service.cluster.local_cluster import start_head

        with tempfile.TemporaryDirectory() as tmp:
            head = start_head(Path(tmp) / "ray", num_cpus=os.cpu_count() if CUDA else 2)
            server = ServerProcess(Path(tmp) / "server", head.dashboard_url).start()
            try:
                http = httpx.Client(base_url=server.url, timeout=30)
                for w in workloads:
                    j = job(w, http, device, checkpoint_every=args.checkpoint_every)
                    results[w.name]["job"] = asdict(j)
                    print(f"job    {w.name}: {j.items_per_s:,.0f} {w.unit}s/s  mfu {j.mfu}  {j.extra}", flush=True)
            finally:
                server.stop()
                head.stop()

    print(
        f"\n{'workload':10}{'params':>9}{'batch':>7}{'prec':>6}{'direct/s':>13}{'job/s':>13}{'ratio':>7}{'job wall/s':>13}{'wall ratio':>11}{'MFU direct':>11}{'MFU job':>9}{'1st metric s':>13}"
    )
    for w in workloads:
        r = results[w.name]
        d, j = r["direct"], r.get("job")
        pct = lambda v: f"{v:.1%}" if v is not None else "-"  # noqa: E731
        row = f"{w.name:10}{w.params / 1e6:>8.1f}M{w.batch_size:>7}{w.precision:>6}{d['items_per_s']:>13,.0f}"
        if j:
            wall = j["extra"]["wall_items_per_s"]
            row += (
                f"{j['items_per_s']:>13,.0f}{j['items_per_s'] / d['items_per_s']:>7.2f}{wall:>13,.0f}{wall / d['items_per_s']:>11.2f}"
                f"{pct(d['mfu']):>11}{pct(j['mfu']):>9}{j['extra']['first_metric_s'] or float('nan'):>13.1f}"
            )
        print(row)
        r["workload"] = asdict(w)
    print("(tokens/s for the GPTs, samples/s for the CNN; goal: ratio >= 0.95 for every row)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": name, "torch": torch.__version__, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
