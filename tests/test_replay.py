"""The best trial's schedule from a PBT lineage (service.events.reads.replay): whose weights a trial
held when, and the spec that replays them. Pure: no Ray, no server."""

from __future__ import annotations

import pytest

from api.client import Client
from api.errors import Conflict, NotFound
from api.schemas import TrainSpec, parse_job_spec
from service.events.reads.replay import Exploit, replay_spec, segments


def exploit(seq: int, trial: str, donor: str, at: int, old: float, new: float, **extra) -> Exploit:
    return Exploit((1, seq), trial, donor, at, {"optimizer.lr": old, **extra}, {"optimizer.lr": new, **extra})


def search(**changes) -> object:
    return parse_job_spec(
        {
            "kind": "tune",
            "base": {"model": {"type": "mlp"}, "optimizer": {"name": "sgd", "lr": 0.01}},
            "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
            "algorithm": "pbt",
            "metric": "val_acc",
            "mode": "max",
            "num_trials": 4,
            "budget": {"epochs": 8},
            **changes,
        }
    )


def test_the_weights_history_crosses_trials_at_each_clone():
    # B clones A at 2; later C clones B at 4; then B clones C at 6 (after C's clone).
    lineage = [
        exploit(10, "B", "A", 2, old=0.3, new=0.02),
        exploit(20, "C", "B", 4, old=0.4, new=0.024),
        exploit(30, "B", "C", 6, old=0.02, new=0.0288),
    ]
    configs = {"A": {"optimizer.lr": 0.05}}
    # A was never cloned: its own value throughout.
    assert segments("A", lineage, configs) == [(0, {"optimizer.lr": 0.05})]
    # C holds A's weights to 2, B's values 2..4, its own from 4.
    assert segments("C", lineage, configs) == [
        (0, {"optimizer.lr": 0.05}),
        (2, {"optimizer.lr": 0.02}),
        (4, {"optimizer.lr": 0.024}),
    ]
    # B at the end: C's history up to 6, then its own new value.
    assert [s[0] for s in segments("B", lineage, configs)] == [0, 2, 4, 6]
    spec = replay_spec(search(), "B", lineage, configs)
    assert isinstance(spec, TrainSpec) and spec.epochs == 8 and spec.optimizer.lr == 0.05
    assert [(i.at, i.values["optimizer.lr"]) for i in spec.schedule.intervals] == [
        (0, 0.05),
        (2, 0.02),
        (4, 0.024),
        (6, 0.0288),
    ]
    assert spec.schedule.values_at(5) == {"optimizer.lr": 0.024}


def test_a_value_no_schedule_can_carry_is_refused_with_the_reason():
    lineage = [
        Exploit((1, 1), "B", "A", 2, {"optimizer.lr": 0.3, "batch_size": 32}, {"optimizer.lr": 0.02, "batch_size": 64})
    ]
    spec = search(
        search_space={
            "optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5},
            "batch_size": {"type": "choice", "values": [32, 64]},
        }
    )
    with pytest.raises(Conflict) as excinfo:
        replay_spec(spec, "B", lineage, {"A": {"optimizer.lr": 0.1, "batch_size": 32}})
    assert excinfo.value.code == "not_replayable"
    assert "batch_size changed at epoch 2" in excinfo.value.message


@pytest.mark.parametrize(
    "schedule,hint",
    [
        (
            {"unit": "epoch", "intervals": [{"at": 0, "values": {"optimizer.lr": 50.0}}]},
            "lr Input should be less than or equal to 10",
        ),
        (
            {"unit": "epoch", "intervals": [{"at": 3, "values": {"optimizer.lr": 0.1}}]},
            "the first interval must be at 0",
        ),
        (
            {
                "unit": "epoch",
                "intervals": [{"at": 0, "values": {"optimizer.lr": 0.1}}, {"at": 0, "values": {"optimizer.lr": 0.2}}],
            },
            "strictly increasing",
        ),
        ({"unit": "epoch", "intervals": [{"at": 0, "values": {"batch_size": 8}}]}, "batch_size cannot be scheduled"),
        ({"unit": "minute", "intervals": [{"at": 0, "values": {"optimizer.lr": 0.1}}]}, "schedule.unit"),
    ],
)
def test_a_bad_schedule_is_refused_with_what_to_change(schedule, hint):
    with pytest.raises(ValueError) as excinfo:
        parse_job_spec({"model": {"type": "mlp"}, "schedule": schedule})
    assert hint in str(excinfo.value)


def test_user_code_reads_its_own_values_not_a_schedule():
    with pytest.raises(ValueError) as excinfo:
        parse_job_spec(
            {
                "entrypoint": "userpkg.steps:train",
                "schedule": {"unit": "step", "intervals": [{"at": 0, "values": {"optimizer.lr": 0.1}}]},
            }
        )
    assert "user code reads its own values" in str(excinfo.value)


def test_replay_over_rest_refuses_what_is_not_a_finished_search(server):
    import httpx

    from bench.harness.specs import digits_spec

    http = httpx.Client(base_url=server.url, timeout=30)
    missing = http.get("/v1/jobs/j000000000000/best/replay")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"
    with pytest.raises(NotFound) as excinfo:
        Client(server.url).replay("j000000000000")
    assert excinfo.value.code == "job_not_found"
    before = http.get("/v1/jobs").json()["total"]
    bad = digits_spec(schedule={"unit": "epoch", "intervals": [{"at": 0, "values": {"optimizer.lr": 50}}]})
    r = http.post("/v1/jobs", json=bad)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_spec"
    assert "schedule.intervals.0.values: lr" in r.json()["error"]["message"]
    # A search sets its trials' values itself: a base with a schedule is refused, nothing stored.
    search_with_schedule = search().model_dump(mode="json")
    search_with_schedule["base"]["schedule"] = {
        "unit": "epoch",
        "intervals": [{"at": 0, "values": {"optimizer.lr": 0.1}}],
    }
    r = http.post("/v1/jobs", json=search_with_schedule)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_spec"
    assert "base.schedule: a search sets the optimizer values" in r.json()["error"]["message"]
    assert "remove base.schedule" in r.json()["error"]["message"]
    assert http.get("/v1/jobs").json()["total"] == before


def test_a_lineage_deeper_than_the_cap_is_409_with_a_code():
    from service.events.reads.replay import MAX_LINEAGE

    chain = [
        exploit(n - i, f"t{i}", f"t{i + 1}", n - i, old=0.1, new=0.01) for n in [MAX_LINEAGE + 1] for i in range(n)
    ]
    with pytest.raises(Conflict) as excinfo:
        segments("t0", chain, {})
    assert excinfo.value.code == "lineage_too_deep" and str(MAX_LINEAGE) in excinfo.value.message
    # At the cap it is walked, without recursion.
    assert len(segments("t1", chain, {})) == MAX_LINEAGE + 1


def test_a_lineage_that_makes_no_valid_schedule_is_409_not_500():
    # No values known before the first clone: the schedule would not start at 0.
    chain = [exploit(1, "B", "A", 3, old=0.1, new=0.01)]
    with pytest.raises(Conflict) as excinfo:
        replay_spec(search(), "B", chain, {})
    assert excinfo.value.code == "not_replayable" and "at 0" in excinfo.value.message
