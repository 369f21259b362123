"""A job's ``scaling.resources_per_worker`` may not name Ray's placement-group resources
(``<resource>_group_<id>``, ``<resource>_group_<index>_<id>``, ``bundle``): asked for,
they would place its workers inside the bundles another job reserved. Refused over real
HTTP with 422 naming the field, and nothing stored; on a server whose Ray address
answers nothing (validation comes before any cluster check)."""

from __future__ import annotations

import httpx
import pytest

from bench.harness.jobstore import dead_ray
from bench.harness.sched_attacks import PLACEMENT_GROUP_NAMES
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("names"), dead_ray()).start()
    with httpx.Client(base_url=proc.url, timeout=30) as client:
        yield client
    proc.stop()


def search(scaling: dict) -> dict:
    base = {k: v for k, v in digits_spec(scaling=scaling).items() if k not in ("name", "epochs", "checkpoint")}
    return {
        "kind": "tune",
        "name": "search",
        "base": base,
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
        "metric": "val_acc",
        "mode": "max",
        "num_trials": 2,
        "budget": {"epochs": 1},
    }


@pytest.mark.parametrize("name", PLACEMENT_GROUP_NAMES)
@pytest.mark.parametrize("kind", ["train", "tune"])
def test_a_placement_group_resource_name_is_refused_naming_the_field(http, name, kind):
    scaling = {"num_workers": 1, "resources_per_worker": {name: 1}}
    body = digits_spec(scaling=scaling) if kind == "train" else search(scaling)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_spec"
    assert "scaling.resources_per_worker" in err["message"]
    assert "placement-group" in err["message"] and "name a custom resource" in err["message"]
    assert http.get("/v1/jobs").json()["total"] == before


def test_a_custom_resource_of_another_form_is_taken(http):
    r = http.post("/v1/jobs", json=digits_spec(scaling={"num_workers": 1, "resources_per_worker": {"infiniband": 1}}))
    assert r.status_code == 202, r.text
    http.post(f"/v1/jobs/{r.json()['id']}/cancel")  # it waits for the cluster: cancelled where it stands
