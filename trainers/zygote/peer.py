"""Who answers on the node's warm socket, checked by the client before it sends anything.

Every job on a cluster runs as the same OS user, so any job can unlink the socket path
and listen there: a client that trusted the path would hand that process its
environment, its launch files' location and its stdio. A file a job can write proves
nothing, so the client reads none; it trusts the peer only when all of these hold:

- ``SO_PEERCRED``: the process that called ``listen()`` runs as this user;
- that process still holds open a listening socket bound to this path (``/proc/net/unix``
  and ``/proc/<pid>/fd``), so its pid was not reused since;
- its parent is the process of the live Ray actor ``raydock-warm-<node id>`` in namespace
  ``raydock`` (read from the cluster's GCS, which a job cannot rewrite short of killing
  that actor), and it started after that actor's process.

Whatever fails, the client starts cold and its log says why. What a same-user job can
still do is in the README's trust model.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct

from api.cluster_contract import WARM_NAME_PREFIX, WARM_NAMESPACE, warm_actor_name

GCS_TIMEOUT_S = 5
_LISTENING = 0x00010000  # __SO_ACCEPTCON in /proc/net/unix's flags
_CRED = struct.Struct("3i")


def peer_pid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that made the socket this one is connected to listen."""
    pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid


def listens_at(pid: int, path: str) -> bool:
    """Whether process ``pid`` holds open a listening unix socket bound to ``path``."""
    inodes = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split(None, 7)
            if len(fields) == 8 and fields[7].rstrip("\n") == path and int(fields[3], 16) & _LISTENING:
                inodes.add(f"socket:[{fields[6]}]")
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") in inodes:
                return True
        except OSError:
            continue
    return False


def stat_fields(pid: int) -> tuple[int, int]:
    """(parent pid, start time in clock ticks since boot) of a live process; OSError if gone."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name is in parentheses and may hold spaces: fields count from its end.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def supervisor_pids(gcs_address: str) -> set[int]:
    """Pids of the live warm-pool supervisor actors the cluster's GCS knows (ray's own client:
    the job's Python has ray, and this runs only once a socket answered)."""
    from ray._raylet import GcsClient

    async def ask() -> dict:  # the client's only call is async: it needs a loop of its own
        gcs = GcsClient(address=gcs_address)
        return await gcs.async_get_all_actor_info(actor_state_name="ALIVE", timeout=GCS_TIMEOUT_S)

    actors = asyncio.run(ask())
    return {
        a.pid
        for a in actors.values()
        if a.ray_namespace == WARM_NAMESPACE and a.name == warm_actor_name(a.node_id.hex()) and a.pid
    }


def distrust(sock: socket.socket, path: str, supervisors: set[int]) -> str | None:
    """Why the peer on ``sock`` is not this node's warm process; None when it is."""
    pid, uid = peer_pid(sock)
    if uid != os.getuid():
        return f"the listener runs as uid {uid}"
    if not listens_at(pid, path):
        return f"process {pid} does not hold the socket at {path}"
    try:
        parent, started = stat_fields(pid)
        parent_started = stat_fields(parent)[1]
    except (OSError, ValueError, IndexError):
        return f"process {pid} or its parent is gone"
    if parent not in supervisors or started < parent_started:
        return f"process {pid} is not the child of this node's {WARM_NAME_PREFIX}<node id> actor"
    return None


def pool_actors() -> tuple[set[int], str | None]:
    """The pids of the cluster's live pool actors, or why they cannot be known. Asked
    before connecting: the warm process serves one client at a time and is not kept
    waiting while the GCS answers."""
    address = os.environ.get("RAY_ADDRESS", "")
    if not address or "://" in address or address == "auto":
        return set(), "no GCS address (RAY_ADDRESS) to ask who the warm process is"
    try:
        return supervisor_pids(address), None
    except Exception as exc:  # noqa: BLE001 - any failure to ask means: do not trust
        return set(), f"could not ask the cluster who the warm process is ({type(exc).__name__}: {exc})"
