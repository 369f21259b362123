"""`pip install raydock` is the client: the SDK and the CLI, without Ray, torch or the
server's libraries. A fast check runs them with those libraries made unimportable; an
opt-in one (`long`) installs the project into a fresh venv with no extras and drives a real
server from it: submit uploaded code, follow it, download its checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from tests.support.specs import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
SERVER_LIBRARIES = ("ray", "torch", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "pydantic_settings")

# Makes the server's libraries unimportable, as in a client-only install, then runs the CLI.
BLOCKED = textwrap.dedent(
    f"""
    import sys
    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {SERVER_LIBRARIES!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, Absent())
    from api.client import Client  # the SDK
    from service.cli import app
    app()
    """
)


def client_only(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_sdk_and_cli_run_without_the_server_libraries():
    assert client_only("--help").returncode == 0
    unreachable = client_only("list", "--url", "http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "Cannot reach the raydock server" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr


@pytest.mark.parametrize("command", ["serve", "gc"])
def test_server_commands_without_the_server_extra_say_what_to_install(command):
    done = client_only(command)
    assert done.returncode == 2, done.stderr
    assert "pip install 'raydock[server]'" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr


@pytest.mark.long
def test_a_fresh_client_only_install_drives_a_real_server(server, tmp_path):
    env_dir = tmp_path / "client"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=600)
    present = subprocess.run(
        [python, "-c", "import importlib.util as u; print([m for m in ('ray', 'torch', 'fastapi') if u.find_spec(m)])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert present.stdout.strip() == "[]"
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: light\nentrypoint: userpkg.ckpt_steps:train\nworking_dir: {FIXTURES / 'usercode'}\n"
        "config: {steps: 3, every: 1, sleep_s: 0}\nscaling: {num_workers: 1}\n"
    )
    raydock = env_dir / "bin" / "raydock"
    env = {**os.environ, "RAYDOCK_URL": server.url}
    submitted = subprocess.run(
        [raydock, "submit", str(spec), "--follow"], env=env, capture_output=True, text=True, timeout=600
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    script = textwrap.dedent(
        f"""
        from api.client import Client
        with Client({server.url!r}) as c:
            job = [j for j in c.list().items if j.name == "light"][0]
            print(job.status.value, c.job(job.id).download_checkpoint(dest={str(tmp_path)!r}))
        """
    )
    done = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    status, path = done.stdout.split()
    assert status == "SUCCEEDED" and any(Path(path).iterdir())
