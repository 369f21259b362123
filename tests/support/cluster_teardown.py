"""Every test leaves the session's Ray cluster as it found it, pass or fail.

``cluster_left_as_found`` (autouse, per test) wraps each test that uses the session's Ray
head (``ray_head``, ``server``, ``client`` or any fixture built on them). After the test,
however it ended:

1. every job that was not yet ended before it and is not ended now, on each raydock server
   of this run that is still up on the session cluster (``ServerProcess.live``), is
   cancelled through that server, and waited for until it has ended (its record says
   CANCELLED, as a user's cancel leaves it);
2. every Ray job that appeared on the cluster during the test and still runs (a server
   the test stopped or pointed elsewhere, a job given to Ray directly) is stopped;
3. a job's driver process that outlived its stop (the last driver Ray knows of each
   submission stopped above, and every driver connected on its own since the test began)
   is killed;
4. the cluster must have as many CPUs free as when the test began, within a bounded wait.
   If not, the test fails at its own teardown, by name, listing what still holds CPUs
   (actors, placement groups, drivers): a job that outlives its test never fails the
   tests after it. What it still holds is then counted as lost to the session, so the
   tests and modules after it are checked against what is left, and fail only for what
   they leak themselves.

``module_leaves_cluster_idle`` (autouse, per module) does the same once a module's own
fixtures are torn down, and then asks for every CPU of the cluster free: a job a
module-scoped fixture started and left is reported against that module.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass, field

import httpx
import pytest

from api.schemas import JobStatus
from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import LocalHead
from service.cluster.ray_backend import RayBackend

UNENDED = [s.value for s in JobStatus if not s.is_terminal()]
CANCEL_WAIT_S = 120.0  # a cancelled job's driver stops, then the monitor's tick records it
STOP_WAIT_S = 60.0  # Ray stops a job's driver (SIGTERM, then SIGKILL)
CPU_WAIT_S = 60.0  # placement groups removed, then Ray's resource report catches up
ORPHAN_AFTER_S = 15.0  # CPUs still held this long after the stops: kill the drivers that outlived them
POLL_S = 0.5

_head: LocalHead | None = None  # the session's head, once a test has used it
_modules_on_cluster: set[str] = set()
_lost_cpus = 0.0  # held by what an earlier test leaked and no teardown could free (reported once, there)


@dataclass
class Snapshot:
    """What ran on the cluster before: the jobs a teardown leaves alone."""

    ray_jobs: set[str] = field(default_factory=set)
    drivers: set[str] = field(default_factory=set)  # Ray job ids of the drivers connected on their own
    taken_at: float = field(
        default_factory=lambda: _since_boot()
    )  # seconds since boot: what started later is the test's
    server_jobs: dict[str, set[str]] = field(default_factory=dict)  # a server's URL -> its unended job ids
    cpus_free: float | None = None  # None: every CPU of the cluster


_backends: dict[str, RayBackend] = {}


def _backend(head: LocalHead) -> RayBackend:
    if head.dashboard_url not in _backends:
        _backends[head.dashboard_url] = RayBackend(head.dashboard_url, auth_token=head.auth_token())
    return _backends[head.dashboard_url]


def _servers_on(head: LocalHead) -> list[ServerProcess]:
    return [s for s in list(ServerProcess.live) if s.ray_address == head.dashboard_url and s.proc.poll() is None]


def _http(server: ServerProcess) -> httpx.Client:
    token = server.token or server.extra_env.get("RAYDOCK_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def _unended(http: httpx.Client) -> set[str]:
    ids: set[str] = set()
    for status in UNENDED:
        cursor = None
        while True:
            params = {"status": status, "limit": 1000, **({"cursor": cursor} if cursor else {})}
            page = http.get("/v1/jobs", params=params).raise_for_status().json()
            ids.update(j["id"] for j in page["items"])
            if not (cursor := page.get("next")):
                break
    return ids


def _ray_get(head: LocalHead, path: str, **params) -> dict | list:
    r = httpx.get(head.dashboard_url + path, params=params, headers=head.headers, timeout=30)
    return r.raise_for_status().json()


def _own_drivers(head: LocalHead, jobs: list | None = None) -> dict[str, int]:
    """Drivers connected to the cluster on their own (no submission), still running: job id
    -> pid; from ``jobs`` when the caller has Ray's job list already."""
    jobs = _ray_get(head, "/api/jobs/") if jobs is None else jobs
    return {
        j["job_id"]: int(j["driver_info"]["pid"])
        for j in jobs
        if j.get("type") == "DRIVER" and j.get("status") == "RUNNING" and j.get("driver_info")
    }


def snapshot(head: LocalHead, *, all_cpus: bool = False) -> Snapshot:
    snap = Snapshot(ray_jobs={j.submission_id for j in _backend(head).list_jobs()}, drivers=set(_own_drivers(head)))
    for server in _servers_on(head):
        with _http(server) as http:
            snap.server_jobs[server.url] = _unended(http)
    if not all_cpus:
        snap.cpus_free = _backend(head).cluster_info().cpus_free
    return snap


def _cancel_through_servers(head: LocalHead, before: Snapshot) -> list[str]:
    """Cancel what each server still runs that ``before`` did not; the jobs that have not
    ended within the wait (their Ray jobs are stopped next)."""
    pending: list[tuple[httpx.Client, str]] = []
    clients = {server.url: _http(server) for server in _servers_on(head)}
    try:
        for url, http in clients.items():
            try:
                left = sorted(_unended(http) - before.server_jobs.get(url, set()))
                if left:
                    http.post("/v1/jobs:cancel", json={"ids": left}).raise_for_status()
            except httpx.HTTPError:
                left = []  # a server the test left unable to answer: its jobs are stopped in Ray below
            pending.extend((http, job_id) for job_id in left)
        pending = _while_any(pending, lambda left: [(h, j) for h, j in left if not _ended(h, j)], CANCEL_WAIT_S)
        return [f"{http.base_url} job {j}" for http, j in pending]
    finally:
        for http in clients.values():
            http.close()


def _while_any(items: list, remaining, timeout: float) -> list:
    """Poll ``remaining(items)`` until it is empty or ``timeout`` passes; what remains."""
    deadline = time.monotonic() + timeout
    while items and time.monotonic() < deadline:
        items = remaining(items)
        if items:
            time.sleep(POLL_S)
    return items


def _ended(http: httpx.Client, job_id: str) -> bool:
    try:
        return JobStatus(http.get(f"/v1/jobs/{job_id}").raise_for_status().json()["status"]).is_terminal()
    except httpx.HTTPError:
        return True  # gone, or its server is: nothing more to wait for there


def _stop_ray_jobs(head: LocalHead, before: Snapshot) -> list[str]:
    """Stop every Ray job that appeared since ``before`` and still runs; those still
    running after the wait."""
    ray = _backend(head)
    started = [j.submission_id for j in ray.list_jobs() if j.is_active and j.submission_id not in before.ray_jobs]
    for submission_id in started:
        ray.stop(submission_id)

    def still_active(left: list[str]) -> list[str]:
        active = {j.submission_id for j in ray.list_jobs() if j.is_active}
        return [s for s in left if s in active]

    return _while_any(started, still_active, STOP_WAIT_S)


def _leftover_drivers(head: LocalHead, before: Snapshot) -> dict[str, int]:
    """Driver processes still alive of what started since ``before``: the last driver of
    each submission (a warm driver is a child of the node's warm process, not of the
    entrypoint Ray stopped) and every driver connected on its own: what -> pid."""
    jobs = _ray_get(head, "/api/jobs/")
    found = {
        f"driver {job_id}": pid for job_id, pid in _own_drivers(head, jobs).items() if job_id not in before.drivers
    }
    for job in jobs:
        sid, info = job.get("submission_id"), job.get("driver_info")
        if job.get("type") == "SUBMISSION" and sid not in before.ray_jobs and info and info.get("pid"):
            found[f"driver of {sid}"] = int(info["pid"])
    return {what: pid for what, pid in found.items() if _started_after(pid, before.taken_at)}


def _since_boot() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def _started_after(pid: int, when: float) -> bool:
    """Whether ``pid`` is a live process started after ``when`` (seconds since boot): a
    reused pid of something older is never killed."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # state ppid pgrp ... starttime is the 20th
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) / os.sysconf("SC_CLK_TCK") >= when


def _kill(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if pid in (os.getpid(), 1):
            continue
        for kill in (os.killpg, os.kill):  # its process group when it leads one (a warm driver does)
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


def holders(head: LocalHead) -> list[str]:
    """What holds CPUs on the cluster now: live actors that asked for CPUs, created
    placement groups, running drivers."""
    out = []
    actors = _ray_get(head, "/api/v0/actors", detail="true", limit="1000")["data"]["result"]["result"]
    for a in actors:
        if a.get("state") == "ALIVE" and (a.get("required_resources") or {}).get("CPU"):
            out.append(f"actor {a.get('class_name')} {a.get('name') or ''} of job {a.get('job_id')} pid {a.get('pid')}")
    groups = _ray_get(head, "/api/v0/placement_groups", detail="true", limit="1000")["data"]["result"]["result"]
    for g in groups:
        if g.get("state") == "CREATED":
            cpus = sum(b.get("unit_resources", {}).get("CPU", 0) for b in g.get("bundles") or [])
            out.append(
                f"placement group {g.get('placement_group_id')} ({cpus:g} CPUs) of job {g.get('creator_job_id')}"
            )
    out += [f"driver {job_id} pid {pid}" for job_id, pid in _own_drivers(head).items()]
    return out


def restore(head: LocalHead, before: Snapshot, who: str) -> None:
    """Cancel and stop what ``who`` left running, kill drivers that outlived their stop,
    then fail naming it unless the CPUs ``before`` found free are free again."""
    global _lost_cpus
    unended = _cancel_through_servers(head, before)
    running = _stop_ray_jobs(head, before)
    ray = _backend(head)
    started = time.monotonic()
    killed: dict[str, int] = {}
    while True:
        info = ray.cluster_info()
        wanted = (info.cpus_total - _lost_cpus) if before.cpus_free is None else before.cpus_free
        if info.cpus_free >= wanted:
            return
        waited = time.monotonic() - started
        if waited >= ORPHAN_AFTER_S and not killed and (killed := _leftover_drivers(head, before)):
            _kill(killed)
            warnings.warn(f"{who}: killed drivers that outlived their Ray jobs: {killed}", stacklevel=1)
        if waited >= CPU_WAIT_S:
            break
        time.sleep(POLL_S)
    still = [j.submission_id for j in ray.list_jobs() if j.is_active]
    _lost_cpus += wanted - info.cpus_free  # the tests after this one are checked against what is left
    pytest.fail(
        f"{who} left {wanted - info.cpus_free:g} of the session cluster's {info.cpus_total:g} CPUs in use "
        f"{CPU_WAIT_S:g} s after its jobs were cancelled; jobs not ended at their server: {unended or 'none'}; "
        f"Ray jobs it started still running: {running or 'none'}; Ray jobs running now: {still or 'none'}; "
        f"drivers killed after outliving their stop: {killed or 'none'}; holding CPUs now: {holders(head) or 'nothing'}",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def cluster_left_as_found(request):
    global _head
    if "ray_head" not in request.fixturenames:
        yield
        return
    _head = head = request.getfixturevalue("ray_head")
    _modules_on_cluster.add(request.node.module.__name__)
    before = snapshot(head)
    yield
    restore(head, before, f"test {request.node.nodeid}")


@pytest.fixture(scope="module", autouse=True)
def module_leaves_cluster_idle(request):
    # Before the module's own fixtures start anything: what ran already stays (with no head
    # yet, nothing did).
    before = snapshot(_head, all_cpus=True) if _head is not None else Snapshot()
    yield
    if _head is not None and request.module.__name__ in _modules_on_cluster:
        restore(_head, before, f"module {request.module.__name__} (its module-scoped fixtures)")
