"""Sharded state: FSDP's memory per worker, and checkpoints that resume exactly."""

import pytest
import torch

from api.schemas import ParallelismSpec
from bench.harness.parallel import CFG, GLOBAL_BATCH, SEED, dataset, make_optimizer, run_workers
from trainers.checkpoint import load_shards, save_shards
from trainers.data.text import batch_at
from trainers.models.gpt import build_gpt
from trainers.parallel import build_mesh, parallelize

pytestmark = pytest.mark.slow  # process groups of torch workers


def _train(pm, steps):
    ds = dataset()
    per_rank = GLOBAL_BATCH // pm.data_world_size
    losses = []
    for step in steps:
        x, y = batch_at(ds, step, per_rank, rank=pm.data_rank, world_size=pm.data_world_size, seed=SEED)
        losses.append(pm.train_step(x, y))
    return losses


def _build(spec, seed=SEED):
    return parallelize(build_gpt(CFG, seed=seed), build_mesh(spec), spec, optimizer_factory=make_optimizer)


def state_bytes_worker(rank, world_size):
    sizes = {}
    for strategy in ("ddp", "fsdp"):
        pm = _build(ParallelismSpec(strategy=strategy))
        _train(pm, range(1))  # AdamW allocates its moments on the first step
        sizes[strategy] = pm.local_state_bytes()
    return sizes


def test_fsdp_holds_about_half_the_parameter_and_optimizer_bytes_of_ddp_on_two_workers():
    for sizes in run_workers(state_bytes_worker, 2):
        # 1/N of the weights and both AdamW moments, plus a little padding where a
        # dimension does not split evenly
        assert 0.45 < sizes["fsdp"] / sizes["ddp"] < 0.55


def resume_worker(rank, world_size, spec, path):
    pm = _build(spec)
    _train(pm, range(0, 4))
    save_shards(pm, path)
    continued = _train(pm, range(4, 8))
    continued_weights = pm.full_model_state_dict()

    # A different initial seed: anything that matches afterwards came from the checkpoint.
    resumed = _build(spec, seed=SEED + 1)
    load_shards(resumed, path)
    start = resumed.step
    replayed = _train(resumed, range(start, 8))
    return {
        "start": start,
        "continued": continued,
        "replayed": replayed,
        "continued_weights": continued_weights,
        "replayed_weights": resumed.full_model_state_dict(),
    }


@pytest.mark.parametrize(
    "spec",
    [
        ParallelismSpec(strategy="fsdp"),
        ParallelismSpec(strategy="ddp"),
        ParallelismSpec(strategy="tensor"),
        ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 2}),
    ],
    ids=["fsdp", "ddp", "tensor", "pipeline"],
)
def test_sharded_checkpoint_resumes_bit_for_bit(spec, tmp_path):
    results = run_workers(resume_worker, 2, spec, str(tmp_path / "ckpt"))
    for r in results:
        assert r["start"] == 4
        assert r["replayed"] == r["continued"]  # exact, not approximate
    weights = results[0]
    assert weights["replayed_weights"].keys() == weights["continued_weights"].keys()
    for name, value in weights["continued_weights"].items():
        assert torch.equal(weights["replayed_weights"][name], value), name


def cross_strategy_worker(rank, world_size, path):
    ddp = _build(ParallelismSpec(strategy="ddp"))
    _train(ddp, range(0, 4))
    save_shards(ddp, path)
    continued = _train(ddp, range(4, 8))
    fsdp = _build(ParallelismSpec(strategy="fsdp"), seed=SEED + 1)
    load_shards(fsdp, path)
    return {"continued": continued, "fsdp": _train(fsdp, range(fsdp.step, 8))}


def test_checkpoint_written_under_ddp_resumes_under_fsdp(tmp_path):
    results = run_workers(cross_strategy_worker, 2, str(tmp_path / "ckpt"))
    for r in results:
        # same numbers, summed in a different order by a different collective
        assert r["fsdp"] == pytest.approx(r["continued"], abs=1e-5)


def full_weights_worker(rank, world_size, specs, weights):
    round_trips = []
    for spec in specs:
        pm = _build(spec, seed=SEED + 1)
        pm.load_full_model_state_dict(weights)
        round_trips.append(pm.full_model_state_dict())
    return round_trips


def test_plain_weights_load_into_every_layout_and_gather_back_unchanged():
    weights = build_gpt(CFG, seed=SEED).state_dict()
    specs = [
        ParallelismSpec(strategy="ddp"),
        ParallelismSpec(strategy="fsdp"),
        ParallelismSpec(strategy="tensor"),
        ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 2}),
    ]
    round_trips = run_workers(full_weights_worker, 2, specs, weights)[0]
    for spec, gathered in zip(specs, round_trips):
        assert gathered.keys() == weights.keys(), spec.strategy
        for name, value in weights.items():
            assert torch.equal(gathered[name], value), f"{spec.strategy}: {name}"
