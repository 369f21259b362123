"""How well a job uses its hardware: throughput, model FLOPs, MFU and GPU memory peaks.

A training loop calls :func:`efficiency_metrics` at each report and merges the result
into the report's metrics. On a GPU that gives, besides ``tokens_per_s`` or
``samples_per_s`` (which the loop measures itself):

- ``flops_per_token`` / ``flops_per_sample``: model FLOPs of one training step's worth of
  work per token (per sample), forward + backward, counted from the model, not measured;
- ``mfu``: model FLOPs utilisation, achieved model FLOP/s over the peak dense FLOP/s of
  every device in the job (0..1), for devices in :data:`PEAK_TFLOPS`;
- ``gpu_mem_allocated_peak_bytes`` / ``gpu_mem_reserved_peak_bytes``: the peaks of
  PyTorch's allocator on this worker since the previous report (allocated: tensors;
  reserved: what the caching allocator holds from the driver).

On CPU only the FLOPs figure is given: there is no meaningful peak to divide by.

The FLOPs of the built-in GPT (:func:`gpt_flops_per_token`) follow the PaLM paper's
appendix B, as nanoGPT and nanochat do:

    flops_per_token = 6 * N + 12 * L * d * T

``N`` counts the parameters that take part in matrix products (every weight and bias
except the token and position embedding tables, which are lookups). Each such
parameter costs 2 FLOPs per token in the forward pass (a multiply and an add) and 4 in
the backward (gradients for the input and for the weight): 6 N. The attention scores
``Q K^T`` and their product with ``V`` add ``2 * 2 * T * d`` per token per layer in the
forward pass, times 3 for forward + backward: ``12 * L * d * T``, with ``L`` layers,
``d`` the model width and ``T`` the sequence length. The causal mask is not credited
(the full ``T x T`` product is counted), the usual convention. Layer norms, GELU,
softmax and the optimizer are left out: they are a few percent at most.

Classifiers (MLP, CNN) are counted by PyTorch's ``FlopCounterMode`` on one forward pass
of an example batch, times 3 for forward + backward (:func:`flops_per_sample`).
"""

from __future__ import annotations

import torch
from torch import nn

# Peak dense tensor-core TFLOP/s (no sparsity) by device name, most specific first.
# ``bf16`` also stands for fp16; ``tf32`` is what fp32 matrix products run at when
# TF32 is allowed (the fast path allows it for fp32 jobs on CUDA). Datasheet figures.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0}),
    ("H100 NVL", {"bf16": 835.0, "tf32": 418.0}),
    ("H100", {"bf16": 989.0, "tf32": 494.5}),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("GH200", {"bf16": 989.0, "tf32": 494.5}),
    ("H200", {"bf16": 989.0, "tf32": 494.5}),
    ("B200", {"bf16": 2250.0, "tf32": 1100.0}),
    ("A100", {"bf16": 312.0, "tf32": 156.0}),
    ("A10", {"bf16": 125.0, "tf32": 62.5}),
    ("L40S", {"bf16": 362.0, "tf32": 183.0}),
    ("L40", {"bf16": 181.0, "tf32": 90.5}),
    ("L4", {"bf16": 121.0, "tf32": 60.0}),
    ("RTX 4090", {"bf16": 165.0, "tf32": 82.6}),
    ("V100", {"bf16": 125.0, "tf32": 15.7}),  # fp16 tensor cores; no TF32 (fp32 peak)
    ("T4", {"bf16": 65.0, "tf32": 8.1}),  # fp16 tensor cores; no TF32 (fp32 peak)
]


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak dense FLOP/s of one ``device`` at ``precision`` ("fp32", "bf16", "fp16").

    ``None`` on CPU and on GPUs the table does not list: MFU is then left out rather
    than computed against a guess.
    """
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    key = "tf32" if precision == "fp32" else "bf16"
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in name:
            return peaks[key] * 1e12
    return None


def gpt_matmul_parameters(*, n_layer: int, d_model: int, vocab_size: int) -> int:
    """Parameters of the built-in GPT (``trainers.models.gpt``) that take part in matrix products.

    From the config rather than from the module: under tensor or pipeline parallelism a
    worker holds only part of the model, but every token still passes through all of it.
    """
    d = d_model
    attention = 4 * (d * d + d)  # q, k, v, proj with biases
    mlp = (d * 4 * d + 4 * d) + (4 * d * d + d)  # fc, proj with biases
    layer_norms = 2 * 2 * d
    head = d * vocab_size  # lm_head, no bias; ln_f's 2 d below
    return n_layer * (attention + mlp + layer_norms) + 2 * d + head


def gpt_flops_per_token(*, n_layer: int, d_model: int, seq_len: int, vocab_size: int) -> int:
    """Training FLOPs per token of the built-in GPT: ``6 N + 12 L d T`` (see module doc)."""
    n = gpt_matmul_parameters(n_layer=n_layer, d_model=d_model, vocab_size=vocab_size)
    return 6 * n + 12 * n_layer * d_model * seq_len


def flops_per_sample(module: nn.Module, example: torch.Tensor) -> int:
    """Training FLOPs per sample of ``module``: one counted forward of ``example`` x 3.

    Runs a forward pass under ``torch.utils.flop_counter.FlopCounterMode`` without
    gradients; call it on the plain model before it is wrapped or compiled.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module(example)
    return 3 * counter.get_total_flops() // max(len(example), 1)


def model_flops_utilisation(
    items_per_s: float, flops_per_item: float, peak_flops: float | None, n_devices: int
) -> float | None:
    """Achieved model FLOP/s of the whole job over the peak of its ``n_devices`` devices."""
    if peak_flops is None or n_devices < 1 or flops_per_item <= 0:
        return None
    return items_per_s * flops_per_item / (peak_flops * n_devices)


def gpu_memory_peaks(device: torch.device, *, reset: bool = True) -> dict[str, int]:
    """Peak allocated and reserved bytes on ``device`` since the last reset; ``{}`` on CPU."""
    if device.type != "cuda":
        return {}
    peaks = {
        "gpu_mem_allocated_peak_bytes": int(torch.cuda.max_memory_allocated(device)),
        "gpu_mem_reserved_peak_bytes": int(torch.cuda.max_memory_reserved(device)),
    }
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peaks


def efficiency_metrics(
    *,
    unit: str,
    items_per_s: float,
    flops_per_item: int | None,
    device: torch.device,
    precision: str,
    n_devices: int,
) -> dict[str, float | int]:
    """The efficiency figures of one report window, ready to merge into its metrics.

    ``unit`` is "token" or "sample"; ``items_per_s`` the whole job's throughput over the
    window; ``n_devices`` every worker of the job (each holds one device).
    """
    metrics: dict[str, float | int] = {}
    if flops_per_item:
        metrics[f"flops_per_{unit}"] = int(flops_per_item)
        mfu = model_flops_utilisation(items_per_s, flops_per_item, device_peak_flops(device, precision), n_devices)
        if mfu is not None:
            metrics["mfu"] = mfu
    metrics.update(gpu_memory_peaks(device))
    return metrics
