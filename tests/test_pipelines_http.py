"""Pipelines over real HTTP (bench/harness/tenancy_world.py: a real server on SQLite, no
Ray, projects alpha and beta and every kind of caller): the SDK and the CLI submit one and
read its graph; a bad graph gets 422 with its code over the wire and nothing stored; a job
of another project is no dependency (it reads as a missing one); a caller outside the
project finds no such pipeline and a viewer cannot change it; cancel ends every step."""

from __future__ import annotations

import pytest
import yaml

from api.client import Client
from api.errors import InvalidSpec
from bench.harness.specs import digits_spec
from tests.support.cli_runner import cli

pytestmark = pytest.mark.slow  # starts a server (no Ray)


@pytest.fixture(scope="module")
def world(tenancy_world):
    return tenancy_world  # shared with tests/test_tenancy_matrix.py (one server start)


def body(**more) -> dict:
    return {
        "name": "pre-fine",
        "project": "alpha",
        "steps": [
            {"name": "pre", "job": digits_spec(name="pre")},
            {"name": "fine", "job": digits_spec(name="fine"), "init_from": {"step": "pre"}},
            {"name": "eval", "job": digits_spec(name="eval"), "after": [{"step": "fine", "status": "ENDED"}]},
        ],
        **more,
    }


def test_the_sdk_and_cli_submit_read_and_cancel_a_pipeline(world, tmp_path):
    with Client(world.url, token=world.tokens["mate"]) as mate:
        made = mate.submit_pipeline(body())
        assert made.project == "alpha" and [s.status.value for s in made.steps] == ["QUEUED", "WAITING", "WAITING"]
        assert made.steps[1].init_from == {"step": "pre", "checkpoint": "best"}
        assert made.id in {p.id for p in mate.pipelines()}
    with world.http("other") as other:
        hidden = other.get(f"/v1/pipelines/{made.id}")
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "pipeline_not_found"
        assert made.id not in other.get("/v1/pipelines").text
        mine = other.post("/v1/jobs", json=digits_spec(project="beta", after=[{"job": made.steps[0].job_id}]))
        assert mine.status_code == 422 and mine.json()["error"]["code"] == "dependency_not_found"
    with world.http("viewer") as viewer:
        assert viewer.get(f"/v1/pipelines/{made.id}").status_code == 200
        refused = viewer.post(f"/v1/pipelines/{made.id}/cancel")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_role"

    owner = world.tokens["owner"]
    shown = cli(world.url, owner, "pipeline", "status", made.id)
    assert shown.exit_code == 0 and "WAITING" in shown.output and "init_from pre" in shown.output, shown.output
    cancelled = cli(world.url, owner, "pipeline", "cancel", made.id)
    assert cancelled.exit_code == 0 and "CANCELLED" in cancelled.output
    with Client(world.url, token=owner) as sdk:
        assert {s.status.value for s in sdk.pipeline(made.id).steps} == {"CANCELLED"}

    spec_file = tmp_path / "pipeline.yaml"
    spec_file.write_text(yaml.safe_dump(body(name="from-cli")))
    submitted = cli(world.url, owner, "pipeline", "submit", str(spec_file))
    assert submitted.exit_code == 0, submitted.output
    new_id = submitted.output.split()[0]
    assert cli(world.url, owner, "pipeline", "cancel", new_id).exit_code == 0
    cyclic = body(name="loop")
    cyclic["steps"][0]["after"] = [{"step": "eval"}]
    spec_file.write_text(yaml.safe_dump(cyclic))
    refused = cli(world.url, owner, "pipeline", "submit", str(spec_file))
    assert (
        refused.exit_code == 2
        and "[pipeline_cycle]" in refused.output
        and "pre -> eval -> fine -> pre" in refused.output
    )


@pytest.mark.parametrize(
    "change, code",
    [
        (lambda b: b["steps"][1].update(after=[{"step": "nope"}]), "unknown_step"),
        (lambda b: b["steps"][2].update(name="pre"), "duplicate_step"),
        (lambda b: b["steps"][1]["job"].update(project="beta"), "cross_project_step"),
        (lambda b: b.update(steps=[]), "invalid_request"),
        (lambda b: b["steps"][0].update(after=[{"step": "x"}] * 17), "invalid_request"),
        (lambda b: b["steps"][0].update(after=[{"step": "x", "job": "j1"}]), "invalid_request"),
    ],
    ids=["unknown step", "duplicate", "cross project", "no steps", "too many after", "step and job"],
)
def test_a_bad_pipeline_gets_422_with_its_code_and_nothing_is_stored(world, change, code):
    bad = body()
    change(bad)
    with world.http("mate") as mate:
        before = mate.get("/v1/jobs").json()["total"]
        r = mate.post("/v1/pipelines", json=bad)
        assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
        assert mate.get("/v1/jobs").json()["total"] == before
    with Client(world.url, token=world.tokens["mate"]) as sdk, pytest.raises(InvalidSpec):
        sdk.request("POST", "/v1/pipelines", json=bad)
