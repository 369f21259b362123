"""Uploaded user code, the slow cases (``RAYDOCK_LONG_TESTS=1``):

- a regular, non-editable install of raydock (a wheel in a fresh virtual environment,
  no import hook of an editable install) with a server, Ray head and job of its own,
  over user code holding ``api/`` and ``service/``: the job's processes import raydock
  from that install and the user's loop its own packages;
- ``runtime_env.pip`` with uploaded code: a pinned package installed for the job;
- a PBT search over uploaded code: one upload, every trial runs that package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import yaml

from api.client import Client
from bench.harness.servers import REPO, ServerProcess
from tests.support.user_code import write_user_code

pytestmark = pytest.mark.long

WHERE_LOOP = '''\
"""Reports where raydock's packages and the user's came from in this Train worker."""
import sys

import ray.train

import api


def main(config):
    ray.train.report({"step": 1, "who": api.WHO, "user_api": api.__file__, "raydock_trainers": sys.modules["trainers"].__file__})
'''

PIP_LOOP = """\
import ray.train
import text_unidecode


def main(config):
    ray.train.report({"step": 1, "unidecoded": text_unidecode.unidecode("ÄÖ")})
"""

PBT_LOOP = '''\
"""A one-weight loop that checkpoints every step and resumes from a checkpoint (PBT clones)."""
import json
import os
import tempfile

import ray.train

import api


def main(config):
    start, w = 0, 0.0
    if (ckpt := ray.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        start, w = state["step"], state["w"]
    for step in range(start + 1, config["steps"] + 1):
        w += config["lr"]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "w": w}, f)
            metrics = {"step": step, "loss": (w - 1.0) ** 2, "who": api.WHO, "loop_file": __file__}
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
'''


def project(root: Path, loop: str, **spec_changes) -> Path:
    spec_file = write_user_code(root)
    (root / "code" / "service" / "extra.py").write_text(loop)
    spec = yaml.safe_load(spec_file.read_text())
    spec.update(entrypoint="service.extra:main", **spec_changes)
    spec_file.write_text(yaml.safe_dump(spec))
    return spec_file


def regular_install(venv: Path) -> str:
    """A virtual environment with raydock installed from a wheel (its dependencies are
    this environment's, on the path after it); returns its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    src = venv.parent / "src"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", "tests")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "bin" / "ray").write_text(
        f"#!{python}\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n"
    )
    (venv / "bin" / "ray").chmod(0o755)
    return str(python)


def test_regular_install_keeps_raydock_and_the_user_apart(tmp_path):
    python = regular_install(tmp_path / "venv")
    where = subprocess.run(
        [python, "-c", "import api, trainers; print(api.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(tmp_path / "venv") in where.stdout  # the wheel, not the checkout
    (tmp_path / "cwd").mkdir()
    env = {"RAYDOCK_CODE_ROOT": "", "RAYDOCK_LOCAL_NUM_CPUS": "2"}
    server = ServerProcess(tmp_path / "data", None, extra_env=env, cwd=tmp_path / "cwd", python=python).start(
        timeout=120
    )
    try:
        spec_file = project(tmp_path / "project", WHERE_LOOP)
        with Client(server.url) as client:
            job = client.submit(yaml.safe_load(spec_file.read_text()), base_dir=spec_file.parent)
            shutil.rmtree(spec_file.parent)
            job.wait(timeout=300)
            assert job.status.value == "SUCCEEDED", job.info.error
            (point,) = job.metrics()
        assert point.metrics["who"] == "the user's api"
        assert "working_dir_files" in point.metrics["user_api"]
        assert point.metrics["raydock_trainers"].startswith(str(tmp_path / "venv"))
    finally:
        server.stop()


def test_pip_requirements_install_for_uploaded_code(client: Client, tmp_path):
    spec_file = project(tmp_path / "project", PIP_LOOP, runtime_env={"pip": ["text-unidecode==1.3"]})
    started = time.monotonic()
    job = client.submit(yaml.safe_load(spec_file.read_text()), base_dir=spec_file.parent)
    job.wait(timeout=480)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert job.metrics()[0].metrics["unidecoded"] == "AO"
    print(f"pip job: submit to SUCCEEDED {time.monotonic() - started:.1f}s")


def test_pbt_search_over_uploaded_code(client: Client, tmp_path):
    spec_file = project(tmp_path / "project", PBT_LOOP)
    base = yaml.safe_load(spec_file.read_text())
    base.pop("name")
    base.update(config={"steps": 6, "lr": 0.1}, scaling={"num_workers": 1, "cpus_per_worker": 0.25})
    spec = {
        "kind": "tune",
        "name": "pbt-uploaded",
        "base": base,
        "search_space": {"config.lr": {"type": "uniform", "low": 0.02, "high": 0.5}},
        "algorithm": "pbt",
        "pbt": {"perturbation_interval": 2},
        "metric": "loss",
        "mode": "min",
        "num_trials": 4,
        "max_concurrent_trials": 4,
        "budget": {"steps": 6},
        "driver_cpus_per_trial": 0.5,
        "seed": 3,
    }
    job = client.submit(spec, base_dir=spec_file.parent)
    shutil.rmtree(spec_file.parent)
    upload = client.last_upload
    assert upload is not None and job.info.spec["base"]["code"] == upload.ref
    job.wait(timeout=600)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert len(trials) == 4 and {t.status for t in trials} == {"TERMINATED"}
    reports = [p for t in trials for p in job.trial_metrics(t.trial_id)]
    assert {p.metrics["who"] for p in reports} == {"the user's api"}
    (loop_file,) = {p.metrics["loop_file"] for p in reports}  # one package, unpacked once, for every trial
    assert "working_dir_files" in loop_file
    assert job.lineage(), "PBT recorded no exploit"
    assert client.code_package(upload.sha256).jobs == 1
