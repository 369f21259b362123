"""The contract refuses what it cannot hold: bounds on every spec field a user can abuse,
and events that are data, not trust. Pure pydantic, plus the same refusals over REST."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from api.schemas import MAX_LABELS, MAX_TRIALS, parse_event, parse_job_spec
from bench.harness.specs import digits_spec


def tune_spec(**overrides) -> dict:
    spec = {
        "kind": "tune",
        "base": digits_spec(epochs=1),
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1}},
        "metric": "val_acc",
        "mode": "max",
    }
    spec.update(overrides)
    return spec


BAD_SPECS = [
    ("infinite lr", digits_spec(optimizer={"name": "adam", "lr": float("inf")}), "optimizer.lr"),
    ("nan timeout", digits_spec(max_runtime_s=float("nan")), "max_runtime_s"),
    ("seed past 2**32", digits_spec(seed=2**32), "seed"),
    ("seed 2**70", digits_spec(seed=2**70), "seed"),
    ("too many labels", digits_spec(labels={f"k{i}": "v" for i in range(MAX_LABELS + 1)}), "labels"),
    ("label key with spaces", digits_spec(labels={"a key": "v"}), "labels"),
    ("label value too long", digits_spec(labels={"k": "v" * 257}), "labels"),
    ("deadline of a century", digits_spec(max_runtime_s=100 * 366 * 86_400), "max_runtime_s"),
    (
        "choice of 1001 values",
        tune_spec(search_space={"batch_size": {"type": "choice", "values": list(range(1, 1002))}}),
        "values",
    ),
    (
        "grid past the trial cap",
        tune_spec(
            algorithm="grid",
            search_space={
                "batch_size": {"type": "grid", "values": list(range(1, 201))},
                "optimizer.lr": {"type": "grid", "values": [0.001 * i for i in range(1, 101)]},
            },
        ),
        f"more than the {MAX_TRIALS} trials",
    ),
    ("tune seed 2**32", tune_spec(seed=2**32), "seed"),
    ("cnn channels of 1e23", digits_spec(model={"type": "cnn", "channels": [10**23]}), "model.cnn.channels"),
    ("mlp of 65 layers", digits_spec(model={"type": "mlp", "hidden_sizes": [8] * 65}), "hidden_sizes"),
    (
        "schedule of 10001 intervals",
        digits_spec(
            schedule={
                "unit": "step",
                "intervals": [{"at": i, "values": {"optimizer.lr": 0.1}} for i in range(10_001)],
            }
        ),
        "schedule.intervals",
    ),
    (
        "scheduled lr of infinity",
        digits_spec(schedule={"unit": "epoch", "intervals": [{"at": 0, "values": {"optimizer.lr": float("inf")}}]}),
        "lr",
    ),
    (
        "schedule at a step past the cap",
        digits_spec(
            schedule={
                "unit": "step",
                "intervals": [
                    {"at": 0, "values": {"optimizer.lr": 0.1}},
                    {"at": 10**9, "values": {"optimizer.lr": 0.01}},
                ],
            }
        ),
        "schedule.intervals.1.at",
    ),
    (
        "search whose base has a schedule",
        tune_spec(
            base=digits_spec(
                epochs=2,
                schedule={
                    "unit": "epoch",
                    "intervals": [
                        {"at": 0, "values": {"optimizer.lr": 0.1}},
                        {"at": 1, "values": {"optimizer.lr": 0.01}},
                    ],
                },
            )
        ),
        "base.schedule: a search sets the optimizer values of its trials itself",
    ),
    (
        "search over the schedule",
        tune_spec(search_space={"schedule.unit": {"type": "choice", "values": ["epoch", "step"]}}),
        "search_space.schedule.unit: cannot be searched: a search sets the optimizer values itself",
    ),
]


@pytest.mark.parametrize("what,spec,hint", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bounds_are_enforced_by_the_contract(what, spec, hint):
    with pytest.raises(ValidationError) as excinfo:
        parse_job_spec(json.loads(json.dumps(spec)))
    assert hint in str(excinfo.value)


def test_bounds_at_their_edge_are_accepted():
    spec = parse_job_spec(digits_spec(seed=2**32 - 1, labels={f"k{i}": "v" * 256 for i in range(MAX_LABELS)}))
    assert spec.seed == 2**32 - 1 and len(spec.labels) == MAX_LABELS


@pytest.mark.parametrize("what,spec,hint", BAD_SPECS[:6], ids=[c[0] for c in BAD_SPECS[:6]])
def test_bounds_over_rest_give_422_and_store_nothing(server, what, spec, hint):
    http = httpx.Client(base_url=server.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    # json.dumps writes Infinity/NaN for non-finite floats, as a careless client would.
    r = http.post("/v1/jobs", content=json.dumps(spec), headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_spec"
    assert hint in r.json()["error"]["message"]
    assert http.get("/v1/jobs").json()["total"] == before


POISON = [
    ("seq not a number", {"type": "metric", "seq": "x", "metrics": {}}),
    ("metrics a list", {"type": "metric", "seq": 0, "metrics": [1]}),
    ("seq 2**70", {"type": "metric", "seq": 2**70, "metrics": {}}),
    ("unknown cause", {"type": "error", "seq": 0, "cause": "BOGUS"}),
    ("cause only the server decides", {"type": "error", "seq": 0, "cause": "TIMEOUT"}),
    ("nodes not a list", {"type": "worker_group", "seq": 0, "world_size": 1, "nodes": "ab"}),
    ("metric int past int64", {"type": "metric", "seq": 0, "metrics": {"step": 2**70}}),
    ("unknown type", {"type": "shutdown_server", "seq": 0}),
    ("negative seq", {"type": "metric", "seq": -1, "metrics": {}}),
    ("huge checkpoint path", {"type": "checkpoint", "seq": 0, "path": "/" + "a" * 5000, "metrics": {}}),
]


@pytest.mark.parametrize("what,event", POISON, ids=[c[0] for c in POISON])
def test_poison_events_do_not_validate(what, event):
    with pytest.raises(ValidationError):
        parse_event(event)


def test_good_events_validate_and_ignore_extra_fields():
    metric = parse_event(
        {"type": "metric", "seq": 3, "ts": 1.5, "metrics": {"step": 4, "loss": 0.5, "note": "nan"}, "extra": 1}
    )
    assert (metric.type, metric.seq, metric.metrics["step"]) == ("metric", 3, 4)
    best = parse_event({"type": "best_trial", "seq": 0, "trial_id": "t1", "value": 0.9})
    assert best.type == "best_trial" and best.value == 0.9
