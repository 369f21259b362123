"""Two real ``raydock serve`` replicas on one real PostgreSQL (their Ray address answers
nothing: no Ray is needed to hold, lose and hand over the background units): each leased
unit runs on exactly one of them; SIGKILL the holder and the other takes every unit under
the next fencing token; SIGSTOP the holder past its TTL and SIGCONT it, and it takes
nothing back and runs nothing more; a graceful stop frees its leases as it exits. A short
lease TTL (RAYDOCK_LEASE_TTL_S) keeps it quick; timings are bench/replicas.py's."""

from __future__ import annotations

import os
import signal

import httpx

from bench.harness.replicas import LEASED, held_by, holder_of, holders, replica, replicas, runs, tokens
from bench.harness.waiting import wait_for

TTL_S = 3.0  # short, yet long past a busy machine's stalls: a holder renews every 0.75 s


def _pair(tmp_path, store, started):
    """A, holding every unit, then B beside it."""
    a = replica(tmp_path / "a", store, TTL_S)
    started.append(a)
    a_id = holder_of(a)
    wait_for(lambda: held_by(a, a_id), 30, "the first replica holds every unit", 0.05)
    b = replica(tmp_path / "b", store, TTL_S)
    started.append(b)
    return a, a_id, b, holder_of(b)


def _claims_after(server, holder: str, n: int = 2) -> None:
    """Until ``holder`` has claimed ``n`` more times (its seen_at moved on n claims' worth)."""
    first = next(r["seen_at"] for r in replicas(server)["replicas"] if r["id"] == holder)
    wait_for(
        lambda: (
            next(r["seen_at"] for r in replicas(server)["replicas"] if r["id"] == holder) >= first + n * TTL_S / 4 * 0.9
        ),
        30,
        f"{holder} claims again",
        0.05,
    )


def test_each_unit_runs_on_one_replica_and_a_killed_holders_units_move(tmp_path, store, started):
    a, a_id, b, b_id = _pair(tmp_path, store, started)
    _claims_after(b, b_id)  # b has asked for the leases again and again meanwhile
    view = replicas(b)
    assert holders(view) == {unit: a_id for unit in LEASED}
    assert {r["id"]: sorted(r["leases"]) for r in view["replicas"]} == {a_id: LEASED, b_id: []}
    on_b = runs(b)
    assert all(on_b.get(unit, 0) == 0 for unit in LEASED)  # b ran none of a's units
    assert on_b.get("warm-pool", 0) > 0  # its own snapshot: on every replica
    assert all(runs(a).get(unit, 0) > 0 for unit in ("monitor", "usage", "webhooks"))
    before = tokens(view)

    a.kill()  # SIGKILL: no release; b waits out the TTL
    wait_for(lambda: held_by(b, b_id), 60, "the survivor takes the killed holder's units", 0.05)
    assert tokens(replicas(b)) == {unit: before[unit] + 1 for unit in LEASED}
    wait_for(lambda: all(runs(b).get(u, 0) > 0 for u in ("monitor", "usage", "webhooks")), 30, "b runs them", 0.05)


def test_a_paused_holder_takes_nothing_back_and_a_graceful_stop_hands_over_at_once(tmp_path, store, started):
    a, a_id, b, b_id = _pair(tmp_path, store, started)
    before = tokens(replicas(b))

    os.kill(a.proc.pid, signal.SIGSTOP)  # paused past its TTL: b takes its units
    wait_for(lambda: held_by(b, b_id), 60, "b takes the paused holder's units", 0.05)
    taken = tokens(replicas(b))
    assert taken == {unit: before[unit] + 1 for unit in LEASED}
    os.kill(a.proc.pid, signal.SIGCONT)
    _claims_after(b, a_id)  # a is back, and has claimed (and lost) twice
    _claims_after(b, a_id, 1)  # and once more: whatever it stopped has stopped
    stopped = runs(a)
    _claims_after(b, a_id)
    view = replicas(b)
    assert holders(view) == {unit: b_id for unit in LEASED} and tokens(view) == taken  # nothing taken back
    assert {r["id"]: sorted(r["leases"]) for r in view["replicas"]} == {a_id: [], b_id: LEASED}
    assert {u: runs(a).get(u, 0) for u in LEASED} == {u: stopped.get(u, 0) for u in LEASED}  # a runs none of them

    b.stop()  # SIGTERM: the lifespan stops its units and frees their leases before it exits
    view = replicas(a)
    assert b_id not in set(holders(view).values())  # free now, not after a TTL
    assert b_id not in {r["id"] for r in view["replicas"]}
    wait_for(lambda: held_by(a, a_id), 30, "a takes them at its next claim", 0.05)
    assert tokens(replicas(a)) == {unit: taken[unit] + 1 for unit in LEASED}


def test_replicas_are_for_server_admins(tmp_path, store, started):
    a = replica(tmp_path / "a", store, TTL_S)
    started.append(a)
    a_id = holder_of(a)  # in local mode still: loopback needs no token until a user is added
    admin = {"Authorization": "Bearer " + (tmp_path / "a" / "admin-token").read_text().strip()}
    httpx.post(a.url + "/v1/users", json={"name": "alice"}, headers=admin, timeout=10).raise_for_status()
    made = httpx.post(a.url + "/v1/users/alice/tokens", json={}, headers=admin, timeout=10)
    made.raise_for_status()
    alice = {"Authorization": f"Bearer {made.json()['token']}"}
    r = httpx.get(a.url + "/v1/replicas", headers=alice, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only"
    mine = httpx.get(a.url + "/v1/replicas", headers=admin, timeout=10)
    assert mine.status_code == 200 and [x["id"] for x in mine.json()["replicas"]] == [a_id]
