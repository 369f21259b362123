"""Links planted where the server writes and deletes in storage, measured against their bounds.

    .venv/bin/python -m bench.abuse_safewrite

No Ray and no server process: the server's own storage calls (``service/files/storage.py``, on
``service/files/nofollow.py``) on a real filesystem, with what a job could plant in its
prefix (harness/write_attacks.py). Prints one row per figure, ``what | figure | bound | ok/FAIL``:

- every plant (a link at the prefix, at ``_raydock/``, at the file; a hard link; a
  directory) under a launch file, a preemption marker and a code package: outside files
  changed, and server files not written whole;
- a launch-file write's time, by fd without following, against a plain write by name;
- descriptors this process holds after 2,000 writes through re-planted links;
- a job swapping ``_raydock/`` between a folder and a link out as fast as it can while the
  server writes 300 launch files: writes that landed outside, and writes given up;
- deleting a prefix with 20,000 files and 1,000 links out, and one with a 10,000-deep chain
  of folders (deeper than a path may be long): its time, and outside files changed.

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from bench.figures import row, run_attacks
from bench.harness.write_attacks import DB_BYTES, PLANTS, deep_chain, plant, tree
from service.files import storage

# What the server writes, as (the job prefix below the storage path, or "" for the storage
# path itself, which is the server's: no plant there), and the file's path below it.
WRITES = {
    "launch file": ("j1", "_raydock/launch-2.json"),
    "preemption marker": ("j1", "_raydock/preempt-2"),
    "code package": ("", "_code/abc.zip"),
}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def every_plant(root: Path) -> None:
    changed, not_whole, tries = 0, 0, 0
    package = root / "package.zip"
    package.write_bytes(b"PK\x05\x06" + bytes(18))
    for what, (job, relative) in WRITES.items():
        for how in PLANTS:
            if not job and how == "prefix":
                continue
            base = root / "every" / f"{what}-{how}".replace(" ", "-")
            under, outside = base / "storage" / job, base / "outside"
            victim = plant(under, relative, how, outside)
            before = tree(outside)
            if job:
                storage.write_private(str(under), relative, b"{}")
                want = b"{}"
            else:
                folder, name = relative.split("/")
                storage.put_file(str(package), str(under / folder), name)
                want = package.read_bytes()
            tries += 1
            changed += victim.read_bytes() != DB_BYTES or tree(outside) != before
            target = under / relative
            not_whole += target.is_symlink() or not target.is_file() or target.read_bytes() != want
    row(f"outside files changed ({tries} plants x writes)", str(changed), "0", changed == 0)
    row("server files not written whole, in place", str(not_whole), "0", not_whole == 0)


def write_cost(root: Path) -> None:
    prefix, n = root / "cost" / "j1", 500
    plain = root / "cost" / "plain"
    plain.mkdir(parents=True)
    fds = _open_fds()
    ours, theirs = [], []
    for i in range(n):
        t0 = time.perf_counter()
        storage.write_private(str(prefix), f"_raydock/launch-{i % 4}.json", b"{}" * 512)
        ours.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        (plain / f"launch-{i % 4}.json").write_bytes(b"{}" * 512)
        theirs.append((time.perf_counter() - t0) * 1000)
    p50, base = statistics.median(ours), statistics.median(theirs)
    row(f"launch-file write, p50 of {n} (plain write by name: {base:.3f} ms)", f"{p50:.3f} ms", "< 5 ms", p50 < 5)
    for i in range(2000):
        link = prefix / "_raydock" / f"launch-{i % 4}.json"
        link.unlink()
        link.symlink_to(root / "cost" / "elsewhere")
        storage.write_private(str(prefix), f"_raydock/launch-{i % 4}.json", b"{}")
    grown = _open_fds() - fds
    row("descriptors held after 2,000 writes through re-planted links", f"+{grown}", "+0", grown <= 0)


def swapping_folder(root: Path) -> None:
    prefix, outside = root / "swap" / "j1", root / "swap" / "outside"
    (prefix / "_raydock").mkdir(parents=True)
    outside.mkdir()
    stop = threading.Event()

    def swapper() -> None:  # the job: _raydock/ a folder, then a link out, over and over
        folder, link = prefix / "_raydock", prefix / "_raydock.link"
        while not stop.is_set():
            try:
                link.symlink_to(outside, target_is_directory=True)
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)
                os.replace(link, folder)
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    given_up, n = 0, 300
    for i in range(n):
        try:
            storage.write_private(str(prefix), f"_raydock/launch-{i}.json", b"{}")
        except OSError:
            given_up += 1
    stop.set()
    thread.join(10)
    landed = len(list(outside.rglob("*")))
    row(f"launch files landed outside while a job swaps _raydock/ ({n} writes)", str(landed), "0", landed == 0)
    row("writes given up meanwhile (the job's own attempt fails)", str(given_up), f"< {n}", given_up < n)


def deletes(root: Path) -> None:
    outside = root / "del" / "outside"
    outside.mkdir(parents=True)
    (outside / "raydock.db").write_bytes(DB_BYTES)
    wide = root / "del" / "storage" / "j1"
    for d in range(100):
        (wide / f"d{d}").mkdir(parents=True)
        for f in range(200):
            (wide / f"d{d}" / f"f{f}").write_bytes(b"x")
        for f in range(10):
            (wide / f"d{d}" / f"l{f}").symlink_to(outside / "raydock.db")
    deep = root / "del" / "storage" / "j2"
    deep_chain(deep, 10_000, outside / "raydock.db")
    before = tree(outside)
    for what, prefix, bound in (("20,000 files, 1,000 links out", wide, 30), ("a 10,000-deep chain", deep, 60)):
        t0 = time.perf_counter()
        storage.remove(str(prefix))
        took = time.perf_counter() - t0
        ok = not os.path.lexists(prefix) and tree(outside) == before
        row(
            f"delete a prefix of {what}",
            f"{took:.2f} s",
            f"< {bound} s, all gone, outside unchanged",
            ok and took < bound,
        )


def main() -> int:
    return run_attacks("safewrite", every_plant, write_cost, swapping_folder, deletes)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
