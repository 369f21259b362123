"""Secrets stay with the server: a server that starts its own Ray head (no RAY_ADDRESS)
with an API token, a database URL and a cloud key in its environment. The head, and so
every process a job's code runs in, sees none of them; it listens on 127.0.0.1 only and
answers only with the Ray token the server made (0600) in its data dir; the data dir is
0700 and the database 0600.
"""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest

from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import LocalHead, _session_pids, find_head
from tests.support.processes import environ

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # starts a Ray head of its own

API_TOKEN = "api-token-that-must-stay-with-the-server"
CLOUD_KEY = "cloud-key-that-must-stay-with-the-server"


@pytest.fixture(scope="module")
def own_head_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("secrets") / "data"
    db_url = f"sqlite:///{data / 'raydock.db'}"
    server = ServerProcess(
        data,
        None,
        token=API_TOKEN,
        # The run's own Ray token (tests/conftest.py) is not this server's: it makes one.
        unset_env=("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"),
        extra_env={"RAYDOCK_LOCAL_NUM_CPUS": "1", "RAYDOCK_DATABASE_URL": db_url, "AWS_SECRET_ACCESS_KEY": CLOUD_KEY},
    )
    head: LocalHead | None = None
    try:
        server.start(timeout=240)
        head = find_head(data / "ray")
        assert head is not None, "the server started no head of its own"
        yield server, head, db_url
    finally:
        server.stop()
        head = head or find_head(data / "ray")
        if head is not None:
            head.stop()


def test_head_environment_holds_no_server_secret(own_head_server):
    server, head, db_url = own_head_server
    pids = _session_pids(head.pid)
    raylets = [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
    assert raylets, "no raylet in the head's process session"
    envs = {p: environ(p) for p in pids}
    raylet_env = envs[raylets[0]]
    assert raylet_env.get("RAY_AUTH_MODE") == "token"
    assert raylet_env.get("RAY_AUTH_TOKEN_PATH") == str(server.data_dir / "ray" / "auth_token")
    for pid, env in envs.items():
        assert not [k for k in env if k.startswith("RAYDOCK_")], (pid, sorted(env))
        for secret in (API_TOKEN, CLOUD_KEY, db_url):
            assert not [k for k, v in env.items() if secret in v], (pid, secret)


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes listen on, from /proc."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = str(fd.readlink()) if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.append((_address(address, width), int(port, 16)))
    return found


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if width == 8:
        return ".".join(str(b) for b in words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in words[12:])  # an IPv4-mapped address
    return ":".join(words[i : i + 2].hex() for i in range(0, 16, 2))


def test_head_listens_on_loopback_only(own_head_server):
    _, head, _ = own_head_server
    sockets = listening(_session_pids(head.pid))
    assert len(sockets) >= 4, sockets  # GCS, raylet, dashboard, agents
    assert all(address == "127.0.0.1" for address, _ in sockets), sockets


def test_ray_token_made_by_the_server_and_required(own_head_server):
    server, head, _ = own_head_server
    token_file = server.data_dir / "ray" / "auth_token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert head.auth_token_path == str(token_file)
    assert httpx.get(head.dashboard_url + "/api/version", timeout=10).status_code == 401
    authorised = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    assert httpx.get(head.dashboard_url + "/api/version", headers=authorised, timeout=10).status_code == 200
    # The server uses it: the cluster it reports is the head's.
    cluster = httpx.get(server.url + "/v1/cluster", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=30)
    assert cluster.status_code == 200, cluster.text
    assert cluster.json()["cpus_total"] == 1


def test_data_dir_and_database_are_private(own_head_server):
    server, head, _ = own_head_server
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((server.data_dir / "raydock.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((server.data_dir / "ray").stat().st_mode) == 0o700
    # Ray makes its own temp dir (job logs, uploaded code) world-writable; the directory around it is not.
    assert stat.S_IMODE(Path(head.temp_dir).stat().st_mode) == 0o700
    assert any(Path(head.temp_dir).glob("*/session_*"))
