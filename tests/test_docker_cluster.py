"""The Ray cluster launcher configs in docker/ (cluster.yaml, cluster-local-fake.yaml): Ray's
own schema and validation, their content, and (with RAYDOCK_TEST_FAKE_CLUSTER=1) a real
autoscaling run on Ray's fake multi-node provider."""

from __future__ import annotations

import copy
import json
import os
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

from tests.support.docker_files import CLUSTER, FAKE_CLUSTER, find_tool, load_yaml, ray_autoscaler_schema, run

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


@pytest.mark.serial  # a Ray cluster of its own
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
