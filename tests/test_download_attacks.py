"""Checkpoint downloads under attack, over real HTTP against a real server (SQLite, no
Ray: ``bench/harness/download_attacks.py`` puts the job and its checkpoint in place, and the
test then does what the job's code or a client could do)."""

from __future__ import annotations

import os
import socket
import time

import httpx
import pytest

from api.client import Client
from api.errors import Busy
from bench.harness import download_attacks as attacks
from service.db.event_models import CheckpointRow

SEND_TIMEOUT_S = 3
LIMIT = 8


def _start(data_dir):
    return attacks.start_target(
        data_dir, RAYDOCK_DOWNLOAD_SEND_TIMEOUT_S=str(SEND_TIMEOUT_S), RAYDOCK_MAX_CONCURRENT_DOWNLOADS=str(LIMIT)
    )


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """One server for the tests that each make a job of their own and hold no download past
    their end (a server start is seconds on a busy machine)."""
    t = _start(tmp_path_factory.mktemp("downloads"))
    yield t
    t.stop()


@pytest.fixture()
def own_target(tmp_path):
    """A server of the test's own: it counts the downloads in flight, so none of another test may linger."""
    t = _start(tmp_path / "server")
    yield t
    t.stop()


def test_files_swapped_for_links_while_the_job_holds_its_download_are_not_read(target, tmp_path):
    f = attacks.swap_while_paused(target, tmp_path)
    print(f"members {len(f.files)}, leaked {f.leaked}")
    assert f.leaked == []
    assert all(f.files[name] == data for name, data in f.big.items())


def test_a_checkpoint_directory_swapped_for_a_link_is_404(target, tmp_path):
    job_id = target.running_job()
    row_id, ckpt = attacks.checkpoint(target, job_id, {"model.pt": b"m" * 100})
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.pt").write_bytes(b"API-HOST-SECRET")
    attacks.swap_for_link(ckpt, str(tmp_path / "elsewhere"))
    r = httpx.get(target.url + attacks.download_path(job_id, row_id))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert b"API-HOST-SECRET" not in r.content


def test_a_fifo_in_a_checkpoint_is_left_out_and_never_waited_on(target):
    job_id = target.running_job()
    row_id, ckpt = attacks.checkpoint(target, job_id, {"model.pt": b"m" * 100})
    os.mkfifo(ckpt / "a-fifo")
    r = httpx.get(target.url + attacks.download_path(job_id, row_id), timeout=20)
    assert r.status_code == 200
    assert attacks.members(r.content) == {"model.pt": b"m" * 100}


def _climb(prefix: str, to: str, up: str = "%2e%2e/") -> str:
    return up * prefix.rstrip("/").count("/") + to.lstrip("/")


# Each: (a path of the API host that exists, one that does not) -> the pair as file:// URIs
# that a check on the raw text takes for paths inside the job's prefix.
ORACLES = {
    "percent-encoded ..": lambda p, host: (f"file://{p}/{_climb(p, host)}", f"file://{p}/{_climb(p, '/no/such')}"),
    "encoded slashes": lambda p, host: (
        f"file://{p}/{_climb(p, host, '..%2F')}",
        f"file://{p}/{_climb(p, '/no/such', '..%2F')}",
    ),
    "a fragment pyarrow drops": lambda p, host: (f"file://{p}/..#", f"file://{p}/no-such/..#"),
}


@pytest.mark.parametrize("oracle", ORACLES)
def test_a_file_uri_checkpoint_path_is_no_existence_oracle_for_api_host_paths(target, tmp_path, oracle):
    """A job reports checkpoints whose file:// paths leave its prefix once pyarrow reads
    them: one names a directory of the API host, the other nothing. Both must be refused
    alike (dropped, never listed, 404), or the listing tells which exists."""
    job_id = target.running_job()
    prefix = target.service.reads.prefix(job_id)
    os.makedirs(prefix, exist_ok=True)
    pair = ORACLES[oracle](prefix, str(tmp_path))
    for seq, path in enumerate(pair):
        r = target.push(job_id, {"type": "checkpoint", "seq": seq, "path": path, "metrics": {}})
        assert r.status_code == 204, r.text
    listed = httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints").json()
    assert listed == [], f"listed {[c['path'] for c in listed]}"
    with target.service.sessions.begin() as s:  # rows an older server may have stored
        rows = [CheckpointRow(job_id=job_id, attempt=1, path=p + "/", values={}) for p in pair]
        s.add_all(rows)
        s.flush()
        ids = [row.id for row in rows]
    assert httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints").json() == []
    for row_id in ids:
        assert httpx.get(target.url + attacks.download_path(job_id, row_id)).status_code == 404


@pytest.mark.slow
def test_stalled_downloads_are_bounded_and_the_server_keeps_answering(tmp_path):
    """100 connections ask for a 32 MiB checkpoint and read nothing."""
    send_timeout_s = 20  # long enough to take the figures while all are held, on a busy machine too
    target = attacks.start_target(
        tmp_path, RAYDOCK_DOWNLOAD_SEND_TIMEOUT_S=str(send_timeout_s), RAYDOCK_MAX_CONCURRENT_DOWNLOADS=str(LIMIT)
    )
    try:
        job_id = target.running_job()
        row_id, _ = attacks.checkpoint(target, job_id, {"model.pt": os.urandom(32 << 20)})
        f = attacks.stall_downloads(target, job_id, row_id, connections=100, send_timeout_s=send_timeout_s)
    finally:
        target.stop()
    print(
        f"100 stalled downloads: {f.served} served, {f.refused} refused (429); GET /v1/jobs p50 {f.list_p50_ms:.0f} ms "
        f"max {f.list_max_ms:.0f} ms; RSS +{f.rss_grew_mib:.0f} MiB; threads +{f.threads_grew}, "
        f"+{f.threads_after_drop} after the send timeout; a fresh download served {f.freed_after_s:.1f} s after the first "
        f"stalled request ({f.fresh_download_status}); bounds in bench/abuse_downloads.py"
    )
    # Every list meanwhile answered 200 (download_attacks.list_ms); how fast is bench/abuse_downloads.py's.
    assert f.served <= LIMIT and f.served + f.refused == f.connections
    assert f.rss_grew_mib < 150
    assert f.threads_grew <= 3 * LIMIT + 8  # a packing thread and a reading one per download, a few of the pool
    assert f.threads_after_drop <= LIMIT + 4
    assert f.fresh_download_status == 200  # the stalled ones were dropped: their slots serve again


def test_one_download_too_many_is_429_with_a_code_and_retry_after(own_target, tmp_path):
    target = own_target
    job_id = target.running_job()
    row_id, _ = attacks.checkpoint(target, job_id, {"model.pt": os.urandom(8 << 20)})
    socks = [attacks.stalled_download(target, attacks.download_path(job_id, row_id)) for _ in range(LIMIT)]
    try:
        assert [attacks.status_of(s) for s in socks] == [200] * LIMIT
        r = httpx.get(target.url + attacks.download_path(job_id, row_id))
        assert r.status_code == 429 and r.headers["Retry-After"] == "5"
        assert r.json()["error"]["code"] == "too_many_downloads"
        assert "RAYDOCK_MAX_CONCURRENT_DOWNLOADS" in r.json()["error"]["message"]
        with Client(target.url) as sdk, pytest.raises(Busy) as refused:  # the SDK says the same, as its own class
            sdk.job(job_id).download_checkpoint(row_id, tmp_path)
        assert refused.value.code == "too_many_downloads" and refused.value.retry_after_s == 5
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_a_client_that_goes_away_stops_the_packing_and_frees_its_place(own_target):
    target = own_target
    job_id = target.running_job()
    row_id, _ = attacks.checkpoint(target, job_id, {"model.pt": os.urandom(16 << 20)})
    attacks.list_ms(target, 3)
    threads0 = attacks.server_threads(target)
    for _ in range(3 * LIMIT):  # each goes after its first bytes; a place not freed would make a 429
        sock = attacks.stalled_download(target, attacks.download_path(job_id, row_id))
        assert attacks.status_of(sock) == 200
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.close()
        time.sleep(0.3)
    time.sleep(2)
    grew = attacks.server_threads(target) - threads0
    print(f"threads over the baseline after {3 * LIMIT} abandoned downloads: {grew}")
    assert grew <= LIMIT + 2


def test_a_checkpoint_nested_deeper_than_the_walk_goes_is_cut_there(target):
    """Each directory level holds an fd while it is packed: 300 levels would hold 300."""
    from service.files.localfs import MAX_DEPTH

    job_id = target.running_job()
    deep = "/".join(["d"] * 300)
    row_id, _ = attacks.checkpoint(target, job_id, {"model.pt": b"m", f"{deep}/x": b"x"})
    r = httpx.get(target.url + attacks.download_path(job_id, row_id), timeout=60)
    assert r.status_code == 200
    assert attacks.members(r.content) == {"model.pt": b"m"}
    assert MAX_DEPTH < 300
