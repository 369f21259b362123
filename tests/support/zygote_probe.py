"""A stand-in driver the warm-process tests fork: ``mark`` changes what a job could
change in its process (a global of a module the warm process imported, an env var, the
cwd, a thread, torch's thread count, sys.path and sys.modules); ``look`` prints what it
sees as one JSON line; ``exit N`` exits with N; ``hang`` waits to be stopped."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import torch

import trainers.launch


def mark(place: str) -> None:
    trainers.launch.PROBE_MARK = "A"
    os.environ["RAYDOCK_PROBE_MARK"] = "A"
    os.chdir(place)
    with open("left-by-a.txt", "w") as f:
        f.write("A")
    sys.path.insert(0, place)
    with open(os.path.join(place, "probe_only_a.py"), "w") as f:
        f.write("X = 1\n")
    __import__("probe_only_a")
    threading.Thread(target=time.sleep, args=(3600,), name="probe-a", daemon=True).start()
    torch.set_num_threads(1)
    look()


def look() -> None:
    seen = {
        "pid": os.getpid(),
        "global": getattr(trainers.launch, "PROBE_MARK", None),
        "env": os.environ.get("RAYDOCK_PROBE_MARK"),
        "given_env": os.environ.get("RAYDOCK_PROBE_GIVEN"),
        "cwd": os.getcwd(),
        "files": sorted(os.listdir(".")),
        "threads": sorted(t.name for t in threading.enumerate()),
        "torch_threads": torch.get_num_threads(),
        "module_a": "probe_only_a" in sys.modules,
        "path0": sys.path[0],
        "argv": sys.argv[1:],
        "random": float(np.random.rand()),
        "cuda": torch.cuda.is_initialized(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "mark":
        mark(sys.argv[2])
    elif what == "look":
        look()
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "hang":
        print("hanging", flush=True)
        time.sleep(3600)
