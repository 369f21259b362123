"""Every file in examples/ is an example that keeps its promise.

Each spec in examples/ opens with a comment that teaches (what it shows, how to run
it) and carries three machine-readable lines, which this module reads:

    # expect: val_acc >= 0.95           one or more: METRIC OP NUMBER, OP one of >= <= > <
    # needs: cpus=2 gpus=0 minutes=1    cores and GPUs it takes, minutes on 2 CPU cores
    # test-with: epochs=4               optional: fields the long test overrides (a heavy example)

``expect`` is judged on the last value of the metric the job reported; for a search
(``kind: tune``), on the best trial's. By default (fast, no server) every spec must
validate, name its promise and its needs, and a user-code spec's entrypoint must be a
function defined in its ``working_dir``; every other file in examples/ must be such
code, so a new example cannot skip the test. Opt-in (``RAYDOCK_LONG_TESTS=1``, the
``long`` marker) each example runs on the session's Ray cluster and reaches its promise;
one that needs more GPUs or cores than the cluster has is skipped, saying why.

    RAYDOCK_LONG_TESTS=1 python -m pytest tests/test_examples.py -s     # prints each figure
"""

from __future__ import annotations

import ast
import operator
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.schemas import TuneSpec, parse_job_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SPECS = sorted(EXAMPLES.glob("*.yaml"))
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
EXPECT = re.compile(r"^#\s*expect:\s*(?P<metric>[A-Za-z_][\w.]*)\s*(?P<op>>=|<=|>|<)\s*(?P<value>[-+0-9.eE]+)\s*$")
NEEDS = re.compile(r"^#\s*needs:\s*(?P<items>.+?)\s*$")
TEST_WITH = re.compile(r"^#\s*test-with:\s*(?P<items>.+?)\s*$")
NEEDS_KEYS = {"cpus", "gpus", "minutes"}


@dataclass(frozen=True)
class Expectation:
    metric: str
    op: str
    value: float

    def met_by(self, figure: float) -> bool:
        return OPS[self.op](figure, self.value)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Example:
    path: Path
    raw: dict[str, Any]
    expects: list[Expectation]
    needs: dict[str, float]
    overrides: dict[str, Any]


def _pairs(items: str, where: str) -> dict[str, str]:
    pairs = {}
    for item in items.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{where}: {item!r} is not KEY=VALUE")
        pairs[key] = value
    return pairs


def read_example(path: Path) -> Example:
    """The spec and its promise; raises ValueError saying which line to add or fix."""
    text = path.read_text()
    expects: list[Expectation] = []
    needs: dict[str, float] = {}
    overrides: dict[str, Any] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("# expect:"):
            if not (m := EXPECT.match(line.strip())):
                raise ValueError(f"{path.name}: {line.strip()!r} is not '# expect: METRIC OP NUMBER'")
            expects.append(Expectation(m["metric"], m["op"], float(m["value"])))
        elif m := NEEDS.match(line.strip()):
            pairs = _pairs(m["items"], path.name)
            if unknown := set(pairs) - NEEDS_KEYS:
                raise ValueError(f"{path.name}: '# needs:' knows {sorted(NEEDS_KEYS)}, not {sorted(unknown)}")
            needs.update({k: float(v) for k, v in pairs.items()})
        elif m := TEST_WITH.match(line.strip()):
            overrides.update({k: yaml.safe_load(v) for k, v in _pairs(m["items"], path.name).items()})
    if not expects:
        raise ValueError(f"{path.name}: add a '# expect: METRIC OP NUMBER' line, the outcome the example promises")
    if set(needs) != NEEDS_KEYS:
        raise ValueError(f"{path.name}: add '# needs: cpus=N gpus=N minutes=N' (what it takes on 2 CPU cores)")
    return Example(path, yaml.safe_load(text), expects, needs, overrides)


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with each dotted field of ``overrides`` set (``budget.epochs=4``)."""
    out = yaml.safe_load(yaml.safe_dump(raw))
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            node = node[key]
        node[leaf] = value
    return out


def entrypoint_is_defined(working_dir: Path, entrypoint: str) -> bool:
    """The module of ``module.path:function`` is a file under ``working_dir`` that
    defines the function at its top level (read, not imported: no torch in the fast suite)."""
    module, _, function = entrypoint.partition(":")
    base = working_dir.joinpath(*module.split("."))
    source = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
    if source is None:
        return False
    tree = ast.parse(source.read_text(), filename=str(source))
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function for node in tree.body
    )


# ----------------------------------------------------------------------------- fast


def test_the_examples_are_found():
    assert {p.name for p in SPECS} >= {"digits-ddp.yaml", "digits-cnn.yaml", "user-code.yaml"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_an_example_validates_and_names_its_promise(path):
    example = read_example(path)
    spec = parse_job_spec(example.raw)
    parse_job_spec(with_overrides(example.raw, example.overrides))  # the long test's variant validates too
    train = spec.base if isinstance(spec, TuneSpec) else spec
    if isinstance(spec, TuneSpec):
        assert [e.metric for e in example.expects] == [spec.metric], "a search promises its own metric"
    if train.is_user_code:
        assert train.working_dir, f"{path.name}: a user-code example ships its code in working_dir"
        assert entrypoint_is_defined(path.parent / train.working_dir, train.entrypoint), train.entrypoint
    assert example.needs["minutes"] > 0 and example.needs["cpus"] > 0


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_every_file_in_examples_is_a_spec_or_the_code_one_ships():
    shipped = set(SPECS)
    for path in SPECS:
        train = parse_job_spec(yaml.safe_load(path.read_text()))
        train = train.base if isinstance(train, TuneSpec) else train
        if train.is_user_code and train.working_dir:
            shipped |= files_under(EXAMPLES / train.working_dir)
    assert sorted(files_under(EXAMPLES) - shipped) == []


def test_a_spec_without_a_promise_is_refused(tmp_path):
    bare = tmp_path / "bare.yaml"
    bare.write_text((EXAMPLES / "digits-ddp.yaml").read_text().replace("# expect:", "# hope:"))
    with pytest.raises(ValueError) as err:
        read_example(bare)
    assert "add a '# expect: METRIC OP NUMBER' line" in str(err.value)


def test_test_with_sets_dotted_fields_and_leaves_the_file_alone(tmp_path):
    heavy = tmp_path / "heavy.yaml"
    heavy.write_text(
        (EXAMPLES / "digits-pbt.yaml").read_text() + "# test-with: budget.epochs=4 pbt.quantile_fraction=0.5\n"
    )
    example = read_example(heavy)
    run = parse_job_spec(with_overrides(example.raw, example.overrides))
    assert (run.budget.epochs, run.pbt.quantile_fraction) == (4, 0.5)
    assert example.raw["budget"]["epochs"] == 8


def test_an_entrypoint_that_is_not_defined_is_found():
    assert entrypoint_is_defined(EXAMPLES / "user_code", "userloop:train")
    assert not entrypoint_is_defined(EXAMPLES / "user_code", "userloop:trian")
    assert not entrypoint_is_defined(EXAMPLES / "user_code", "nosuchmodule:train")


# ----------------------------------------------------------------------------- long


def figure(job, metric: str) -> float:
    """The promised metric's outcome: a search's best trial's, a job's last reported value."""
    if isinstance(parse_job_spec(job.info.spec), TuneSpec):
        best = job.best()
        return best.value if best.metric == metric else float(best.metrics[metric])
    values = [p.metrics[metric] for p in job.metrics() if metric in p.metrics]
    assert values, f"job {job.id} never reported {metric}"
    return float(values[-1])


@pytest.mark.long
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_an_example_reaches_its_promise(path, client):
    example = read_example(path)
    cluster = client.cluster()
    if example.needs["gpus"] > cluster.gpus_total:
        pytest.skip(f"{path.name} needs {example.needs['gpus']:g} GPU(s); the cluster has {cluster.gpus_total:g}")
    if example.needs["cpus"] > cluster.cpus_total:
        pytest.skip(f"{path.name} needs {example.needs['cpus']:g} CPUs; the cluster has {cluster.cpus_total:g}")
    started = time.monotonic()
    job = client.submit(with_overrides(example.raw, example.overrides), base_dir=path.parent)
    job.wait(timeout=120 + 4 * 60 * example.needs["minutes"])
    took = time.monotonic() - started
    assert job.status.value == "SUCCEEDED", job.info.error or job.info.status_reason
    figures = {e.metric: figure(job, e.metric) for e in example.expects}
    print(f"\n{path.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()) + f" in {took:.0f} s")
    missed = [f"{e} (got {figures[e.metric]:.4g})" for e in example.expects if not e.met_by(figures[e.metric])]
    assert missed == []
