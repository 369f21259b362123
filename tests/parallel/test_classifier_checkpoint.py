"""One checkpoint format for the classifiers: fp32 and bf16 write the same files and
both resume exactly (and into each other), on 2 gloo workers, through the loop's own
model building, step stream and ``trainers.checkpoint``."""

import os

import pytest
import torch

from api.schemas import TrainSpec
from bench.harness.parallel import run_workers
from trainers import checkpoint
from trainers.classifier_loop import build_classifier, steps
from trainers.data.tabular import InMemoryData
from trainers.models import build_model
from trainers.skeleton import Start

pytestmark = pytest.mark.slow  # trains and resumes in torch worker processes

SAVE_AT = 3


def classifier_spec(precision: str) -> TrainSpec:
    return TrainSpec(
        model={"type": "mlp", "hidden_sizes": [32]},
        data={"source": "digits"},
        optimizer={"name": "adam", "lr": 1e-2},
        batch_size=32,
        max_steps=6,
        parallelism={"precision": precision},
    )


def build(spec: TrainSpec, data: InMemoryData, seed: int):
    torch.manual_seed(seed)
    return build_classifier(spec, data.n_features, data.n_classes)


def save_and_resume_worker(rank, world_size, root):
    out = {}
    for precision in ("fp32", "bf16"):
        spec = classifier_spec(precision)
        data = InMemoryData(spec, rank, world_size)
        run = list(steps(spec, data, Start()))
        pm = build(spec, data, seed=0)
        for s in run[:SAVE_AT]:
            pm.train_step(s.inputs, s.targets)
        path = os.path.join(root, precision)
        os.makedirs(path, exist_ok=True)
        meta = checkpoint.describe(spec, pm, epoch=0, n_features=data.n_features, n_classes=data.n_classes)
        checkpoint.save(path, pm, meta)
        continued = [pm.train_step(s.inputs, s.targets) for s in run[SAVE_AT:]]

        # Another initial seed: whatever matches afterwards came from the checkpoint.
        resumed = build(spec, data, seed=1)
        restored_meta = checkpoint.restore(path, resumed)
        start = resumed.step
        replayed = [resumed.train_step(s.inputs, s.targets) for s in run[start:]]
        out[precision] = {
            "files": sorted(os.listdir(path)),
            "meta": restored_meta,
            "start": start,
            "continued": continued,
            "replayed": replayed,
        }
    # The same format both ways: an fp32 checkpoint resumes a bf16 run and vice versa.
    for saved, into in (("fp32", "bf16"), ("bf16", "fp32")):
        spec = classifier_spec(into)
        data = InMemoryData(spec, rank, world_size)
        pm = build(spec, data, seed=2)
        checkpoint.restore(os.path.join(root, saved), pm)
        out[f"{saved}->{into}"] = {"step": pm.step, "weights": pm.full_model_state_dict()}
    return out


def test_fp32_and_bf16_classifier_checkpoints_share_one_format_and_resume_exactly(tmp_path):
    results = run_workers(save_and_resume_worker, 2, str(tmp_path))
    fp32, bf16 = results[0]["fp32"], results[0]["bf16"]

    assert fp32["files"] == bf16["files"] == ["model.pt", "shards", "state.json"]
    assert sorted(os.listdir(tmp_path / "fp32" / "shards")) == sorted(os.listdir(tmp_path / "bf16" / "shards"))
    assert fp32["meta"].keys() == bf16["meta"].keys()
    assert (fp32["meta"]["precision"], bf16["meta"]["precision"]) == ("fp32", "bf16")
    for meta in (fp32["meta"], bf16["meta"]):
        assert meta["format"] == checkpoint.FORMAT
        assert (meta["step"], meta["epoch"], meta["world_size"], meta["strategy"]) == (SAVE_AT, 0, 2, "ddp")
        assert meta["hyperparameters"] == {
            "optimizer": {"name": "adam", "lr": 1e-2, "weight_decay": 0.0, "momentum": 0.0},
            "batch_size": 32,
        }

    for r in results:
        for precision in ("fp32", "bf16"):
            assert r[precision]["start"] == SAVE_AT
            assert r[precision]["replayed"] == r[precision]["continued"]  # exact, not approximate

    # model.pt is plain weights for a fresh model, and the same weights the shards hold.
    for saved, into in (("fp32", "bf16"), ("bf16", "fp32")):
        meta = results[0][saved]["meta"]
        model = build_model(classifier_spec(saved).model, meta["n_features"], meta["n_classes"])
        model.load_state_dict(checkpoint.load_weights(tmp_path / saved))
        moved = results[0][f"{saved}->{into}"]
        assert moved["step"] == SAVE_AT
        for name, value in model.state_dict().items():
            assert torch.equal(moved["weights"][name], value), f"{saved} -> {into}: {name}"
