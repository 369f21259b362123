"""Starting a node's warm pool from a cold driver, in the background.

The first job on a node finds no warm process: its client runs the cold driver and
names the socket it looked for (``START_ENV``). The driver then starts
``python -m trainers.zygote.supervisor`` as a detached process that connects to the
cluster as a job of its own, with none of this job's runtime_env (working_dir,
env_vars, pip), and creates the node's supervisor actor if there is none. The driver
waits for none of it: the second job on the node starts warm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainers.zygote.protocol import IDLE_ENV, START_ENV

DEFAULT_IDLE_S = 600.0
# A job running in an environment of its own: the pool's warm process would not be its Python.
OWN_ENVIRONMENT_KEYS = ("pip", "uv", "conda", "py_executable", "container", "image_uri")


def idle_s() -> float:
    try:
        return max(1.0, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S)))
    except ValueError:
        return DEFAULT_IDLE_S


def job_runtime_env() -> dict:
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    except ValueError:
        return {}
    return config.get("runtime_env") or {}


def clean_env() -> dict[str, str]:
    """This driver's environment without what belongs to its job: the job's env_vars,
    its job config, and the working_dir or py_modules Ray put on PYTHONPATH."""
    runtime_env = job_runtime_env()
    own = set(runtime_env.get("env_vars") or {})
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in own and k != "RAY_JOB_CONFIG_JSON_ENV_VAR" and not k.startswith("RAYDOCK_")
    }
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "runtime_resources" not in p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[IDLE_ENV] = str(idle_s())
    return env


def start_if_asked() -> bool:
    """Start the node's warm pool in the background when the client asked for it; True
    when a starter was launched."""
    path = os.environ.pop(START_ENV, None)
    if not path or os.path.exists(path):
        return False
    if any(runtime_env_key in job_runtime_env() for runtime_env_key in OWN_ENVIRONMENT_KEYS):
        return False
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        log = open(os.path.join(folder, "starter.log"), "ab")
        subprocess.Popen(
            [sys.executable, "-m", "trainers.zygote.supervisor", "--socket", path],
            env=clean_env(),
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the job's process group: a stop of this job leaves it be
        )
        log.close()
    except OSError as exc:
        print(f"raydock: could not start the warm pool: {exc}", file=sys.stderr)
        return False
    return True
