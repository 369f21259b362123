"""Attacks on checkpoint downloads, as a job's code (it writes its own storage) or any
client could make them, against a real server (real HTTP, SQLite, no Ray: the job and
its checkpoint row are put in the store, the checkpoint's files in the job's prefix).
Shared by tests/test_download_attacks.py and ``python -m bench.abuse_downloads``, which
print the same figures."""

from __future__ import annotations

import io
import os
import socket
import statistics
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.attacks import Target, start_target
from service.db.event_models import CheckpointRow

__all__ = ["Target", "start_target"]


def checkpoint(
    target: Target, job_id: str, files: dict[str, bytes], name: str = "checkpoint_000001"
) -> tuple[int, Path]:
    """``files`` written in the job's prefix as a checkpoint the job reported; its row id and directory."""
    ckpt = Path(target.service.reads.prefix(job_id)) / name
    for rel, data in files.items():
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / rel).write_bytes(data)
    with target.service.sessions.begin() as s:
        row = CheckpointRow(job_id=job_id, attempt=1, path=str(ckpt), step=1, epoch=1, values={})
        s.add(row)
        s.flush()
        return row.id, ckpt


def download_path(job_id: str, row_id: int) -> str:
    return f"/v1/jobs/{job_id}/checkpoints/{row_id}/download"


def swap_for_link(path: Path, target: str) -> None:
    """Replace ``path`` (a file or a directory) by a symlink to ``target``, in one rename
    for a file, as a job racing the server would."""
    tmp = path.with_name(path.name + ".swap")
    os.symlink(target, tmp)
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    os.replace(tmp, path)


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@dataclass
class SwapFigures:
    files: dict[str, bytes]  # what the download held
    big: dict[str, bytes]  # the checkpoint's own large files (packed before the swap)
    leaked: list[str]  # members whose bytes are the API host's


def swap_while_paused(target: Target, host_dir: Path) -> SwapFigures:
    """The job lists a checkpoint of its own, starts its download, stops reading once the
    server has packed a piece, swaps the files not yet packed (and a directory) for links
    to files of the API host (a secret of its own and /proc/self/environ), then reads on."""
    secret = b"API-HOST-SECRET-" * 64
    (host_dir / "host-secret.txt").write_bytes(secret)  # a file of the API host, outside every prefix
    (host_dir / "host-dir").mkdir()
    (host_dir / "host-dir" / "part0").write_bytes(secret)
    environ = Path(f"/proc/{target.server.proc.pid}/environ").read_bytes()
    job_id = target.running_job()
    big = {f"big{i}.bin": os.urandom(16 << 20) for i in range(4)}  # far more than the pipe and sockets hold
    small = {f"s{i:02d}": b"a" * 48 for i in range(20)}
    row_id, ckpt = checkpoint(target, job_id, {**big, **small, "shards/part0": b"b" * 48})

    with httpx.Client() as client, client.stream("GET", target.url + download_path(job_id, row_id)) as r:
        assert r.status_code == 200, r.read()
        pieces = r.iter_raw()
        got = [next(pieces)]
        time.sleep(1.5)  # the server's packing thread now waits on the full pipe
        for i, name in enumerate(small):
            swap_for_link(ckpt / name, "/proc/self/environ" if i % 2 else str(host_dir / "host-secret.txt"))
        swap_for_link(ckpt / "shards", str(host_dir / "host-dir"))
        got.extend(pieces)

    files = members(b"".join(got))
    leaked = [n for n, data in files.items() if n not in big and (data in secret or data in environ)]
    return SwapFigures(files, big, leaked)


# ------------------------------------------------------------------------------- stalled clients


def stalled_download(target: Target, path: str) -> socket.socket:
    """A connection that asks for ``path`` and then reads nothing (a tiny receive buffer,
    so the server's sends stall soon)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", target.server.port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{target.server.port}\r\n\r\n".encode())
    return sock


def status_of(sock: socket.socket, timeout: float = 5.0) -> int:
    """The status the server answered on ``sock`` (read only now, 12 bytes); 0 if none yet."""
    sock.settimeout(timeout)
    try:
        head = sock.recv(12, socket.MSG_PEEK)
    except OSError:
        return 0
    return int(head[9:12]) if head.startswith(b"HTTP/1.1 ") and len(head) == 12 else 0


def server_threads(target: Target) -> int:
    return len(os.listdir(f"/proc/{target.server.proc.pid}/task"))


def server_rss_mib(target: Target) -> float:
    for line in Path(f"/proc/{target.server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def list_ms(target: Target, n: int = 5) -> list[float]:
    """``n`` GET /v1/jobs, one after another; each one's time."""
    out = []
    with httpx.Client() as client:
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.get(f"{target.url}/v1/jobs", timeout=60)
            out.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
    return out


@dataclass
class StallFigures:
    connections: int
    served: int  # answered 200 (their packing started)
    refused: int  # answered 429 too_many_downloads
    list_ms: list[float]
    rss_grew_mib: float
    threads_grew: int
    threads_after_drop: int  # over the baseline, once the send timeout dropped the stalled ones
    fresh_download_status: int  # a download asked for after the drop
    freed_after_s: float  # from the first stalled request until a fresh download was served

    @property
    def list_max_ms(self) -> float:
        return max(self.list_ms)

    @property
    def list_p50_ms(self) -> float:
        return statistics.median(self.list_ms)


def stall_downloads(target: Target, job_id: str, row_id: int, connections: int, send_timeout_s: float) -> StallFigures:
    """``connections`` stalled downloads of one checkpoint, held open; once each has its
    answer, what the server costs and how fast it lists jobs meanwhile, then whether the
    send timeout drops them. ``send_timeout_s`` must outlast the answers and the lists."""
    path = download_path(job_id, row_id)
    list_ms(target, 3)  # the thread pool and the connection to the store are warm
    rss0, threads0 = server_rss_mib(target), server_threads(target)
    socks = []
    try:
        t0 = time.monotonic()
        for _ in range(connections):
            socks.append(stalled_download(target, path))
        statuses = [status_of(s, timeout=60) for s in socks]
        time.sleep(1.0)  # every started download has filled its buffers
        latencies = list_ms(target)
        rss, threads = server_rss_mib(target), server_threads(target)
        assert time.monotonic() - t0 < send_timeout_s, "the figures were taken after the send timeout"
        time.sleep(max(0.0, send_timeout_s - (time.monotonic() - t0)))
        fresh, deadline = 0, time.monotonic() + 15  # the stalled ones are dropped one send timeout after they stalled
        with httpx.Client() as client:
            while fresh != 200 and time.monotonic() < deadline:
                with client.stream("GET", target.url + path, timeout=60) as r:
                    fresh = r.status_code
                    r.read()
                time.sleep(0.5)
        freed_after_s = time.monotonic() - t0
        time.sleep(1.0)
        threads_after = server_threads(target) - threads0
    finally:
        for s in socks:
            s.close()
    return StallFigures(
        connections,
        statuses.count(200),
        statuses.count(429),
        latencies,
        rss - rss0,
        threads - threads0,
        threads_after,
        fresh,
        freed_after_s,
    )
