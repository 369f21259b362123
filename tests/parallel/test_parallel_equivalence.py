"""Every strategy trains exactly like one process does (fp32, same seed, same batches).

20 AdamW steps on the tiny GPT: the loss at every step, the validation loss and the
final weights (gathered back to a plain model) must match the single-process
reference within 1e-4.
"""

import pytest
import torch

from api.schemas import ParallelismSpec
from bench.harness.parallel import (
    CFG,
    GLOBAL_BATCH,
    SEED,
    dataset,
    make_optimizer,
    reference_run,
    run_workers,
    train_specs_worker,
    val_batch,
)
from trainers.data.text import batch_at
from trainers.models.gpt import build_gpt, lm_loss
from trainers.parallel import build_mesh, parallelize

pytestmark = pytest.mark.slow  # process groups of 2-4 torch workers, minutes of CPU

STEPS = 20
TOL = 1e-4


def train_worker(rank, world_size, spec, steps):
    mesh = build_mesh(spec)
    pm = parallelize(build_gpt(CFG, seed=SEED), mesh, spec, optimizer_factory=make_optimizer)
    ds = dataset()
    per_rank = GLOBAL_BATCH // pm.data_world_size
    losses = []
    for step in range(steps):
        x, y = batch_at(ds, step, per_rank, rank=pm.data_rank, world_size=pm.data_world_size, seed=SEED)
        losses.append(pm.train_step(x, y))
    vx, vy = val_batch()
    rows = slice(pm.data_rank * per_rank, (pm.data_rank + 1) * per_rank)
    val = pm.evaluate(vx[rows], vy[rows])
    return {"losses": losses, "val": val, "state": pm.full_model_state_dict()}


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS)


def assert_matches_reference(results, reference):
    for r in results:
        # every worker reports the same global loss, not just its own share
        assert r["losses"] == pytest.approx(reference["losses"], abs=TOL)
        assert r["val"] == pytest.approx(reference["val"], abs=TOL)
    full = results[0]["state"]
    assert all(r["state"] == {} for r in results[1:])  # gathered onto rank 0 only
    assert full.keys() == reference["state"].keys()
    for name, ref in reference["state"].items():
        torch.testing.assert_close(full[name], ref, atol=TOL, rtol=0, msg=name)
    assert reference["losses"][-1] < reference["losses"][0] - 0.5  # it actually learned


@pytest.mark.parametrize(
    "spec",
    [
        ParallelismSpec(strategy="ddp"),
        ParallelismSpec(strategy="fsdp"),
        ParallelismSpec(strategy="tensor"),
        ParallelismSpec(strategy="pipeline", pipeline={"schedule": "gpipe", "microbatches": 2}),
        ParallelismSpec(strategy="pipeline", pipeline={"schedule": "1f1b", "microbatches": 4}),
        ParallelismSpec(strategy="hybrid", mesh={"data": 1, "tensor": 2}),
    ],
    ids=["ddp", "fsdp", "tensor", "pipeline-gpipe", "pipeline-1f1b", "hybrid-1x2-tensor"],
)
def test_two_workers_match_single_process(spec, reference):
    results = run_workers(train_worker, 2, spec, STEPS)
    assert_matches_reference(results, reference)


@pytest.mark.parametrize(
    "spec",
    [
        ParallelismSpec(strategy="hybrid", mesh={"data": 2, "tensor": 2}),
        ParallelismSpec(strategy="hybrid", mesh={"data": 2, "pipeline": 2}, pipeline={"microbatches": 2}),
        ParallelismSpec(strategy="tensor", tensor_degree=2),
    ],
    ids=["hybrid-2x2-tensor", "hybrid-2x2-pipeline", "tensor-degree-2-of-4"],
)
def test_four_workers_data_and_model_axes_match_single_process(spec, reference):
    # 4 processes on 2 cores is slow, but it is the only way to have a data axis and a
    # model axis at once.
    results = run_workers(train_worker, 4, spec, STEPS, timeout_s=240)
    assert_matches_reference(results, reference)


def test_bf16_autocast_stays_close_to_fp32(reference):
    specs = [
        ParallelismSpec(strategy="ddp", precision="bf16"),
        ParallelismSpec(strategy="fsdp", precision="bf16"),
        ParallelismSpec(strategy="tensor", precision="bf16"),
        ParallelismSpec(strategy="pipeline", precision="bf16", pipeline={"microbatches": 2}),
    ]
    runs = run_workers(train_specs_worker, 2, specs, STEPS)[0]
    for spec, run in zip(specs, runs):
        assert run["losses"] == pytest.approx(reference["losses"], abs=5e-3), spec.strategy
        # bf16 matmuls round differently: identical numbers would mean autocast never ran
        assert run["losses"] != reference["losses"], spec.strategy


def misuse_worker(rank, world_size):
    errors = {}
    spec = ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 4})
    pm = parallelize(build_gpt(CFG, seed=SEED), build_mesh(spec), spec, optimizer_factory=make_optimizer)
    x, y = batch_at(dataset(), 0, 6, seed=SEED)
    try:
        pm.train_step(x, y)
    except ValueError as e:
        errors["microbatches"] = str(e)
    ddp_mesh = build_mesh(ParallelismSpec())
    try:
        parallelize(build_gpt(CFG, seed=SEED), ddp_mesh, spec, optimizer_factory=make_optimizer)
    except ValueError as e:
        errors["mesh"] = str(e)
    compressed_fsdp = ParallelismSpec(strategy="fsdp", grad_compression="powersgd")
    try:
        parallelize(build_gpt(CFG, seed=SEED), ddp_mesh, compressed_fsdp, optimizer_factory=make_optimizer)
    except ValueError as e:
        errors["spec"] = str(e)
    return errors


def test_misuse_is_refused_with_the_knob_to_turn():
    errors = run_workers(misuse_worker, 2)[0]
    assert errors == {
        "microbatches": "a per-worker batch of 6 rows cannot be split into 4 equal parts; "
        "make the batch size a multiple of parallelism.pipeline.microbatches",
        "mesh": "mesh shape (2, 1, 1) does not match the spec's (1, 2, 1); build it with build_mesh(spec)",
        "spec": "invalid parallelism: parallelism.grad_compression: gradient compression runs in ddp's "
        "communication hooks; strategy fsdp synchronises gradients differently. Set grad_compression: "
        "none or use ddp.",
    }


def batch_shapes_worker(rank, world_size, spec):
    pm = parallelize(build_gpt(CFG, seed=SEED), build_mesh(spec), spec, optimizer_factory=make_optimizer)
    ds = dataset()
    losses = [pm.train_step(*batch_at(ds, 0, 16, seed=SEED)), pm.train_step(*batch_at(ds, 1, 8, seed=SEED))]
    vx, vy = val_batch()
    return {"losses": losses, "val": pm.evaluate(vx[:4], vy[:4])}


def test_pipeline_accepts_a_new_batch_shape():
    # a last partial batch or a smaller evaluation batch needs new activation shapes
    spec = ParallelismSpec(strategy="pipeline", pipeline={"microbatches": 2})
    results = run_workers(batch_shapes_worker, 2, spec)

    model = build_gpt(CFG, seed=SEED)
    opt = make_optimizer(list(model.parameters()))
    expected = []
    for step, rows in ((0, 16), (1, 8)):
        x, y = batch_at(dataset(), step, rows, seed=SEED)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        expected.append(loss.item())
    vx, vy = val_batch()
    with torch.no_grad():
        expected_val = lm_loss(model(vx[:4]), vy[:4]).item()
    for r in results:
        assert r["losses"] == pytest.approx(expected, abs=TOL)
        assert r["val"] == pytest.approx(expected_val, abs=TOL)
