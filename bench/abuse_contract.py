"""What the cluster contract (``api.cluster_contract``) costs the warm-start client,
measured against its bounds.

    .venv/bin/python -m bench.abuse_contract

The client (``python -m trainers.zygote.client``) starts every job, so it stays standard
library only. Each figure comes from fresh interpreters (``python -X importtime``, median
of five), no Ray and no server, one row per figure, ``what | figure | bound | ok/FAIL``:

- the modules beyond the standard library the client imports (raydock's own aside);
- the import time of ``api.cluster_contract`` itself, and of the whole client.

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.figures import row, run_attacks

ROOT = Path(__file__).resolve().parents[1]
CLIENT = "trainers.zygote.client"
OWN = ("api", "trainers", "tuning", "service")
RUNS = 5


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)


def _cumulative_us(stderr: str, module: str) -> int:
    """The cumulative import time of ``module`` from ``-X importtime``'s table, in µs."""
    for line in stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise LookupError(f"{module} is not in the import table")


def foreign_modules(_: Path) -> None:
    code = (
        f"import json, sys; stdlib = set(sys.stdlib_module_names); import {CLIENT}; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - stdlib)))"
    )
    tops = json.loads(_python("-c", code).stdout)
    foreign = [m for m in tops if m not in OWN and not m.startswith("_")]
    row("modules beyond the standard library the warm-start client imports", str(foreign), "[]", foreign == [])


def import_times(_: Path) -> None:
    contract, client = [], []
    for _ in range(RUNS):
        table = _python("-X", "importtime", "-c", f"import {CLIENT}").stderr
        contract.append(_cumulative_us(table, "api.cluster_contract"))
        client.append(_cumulative_us(table, CLIENT))
    ms = statistics.median(contract) / 1000
    row("import of api.cluster_contract in the client (median of 5)", f"{ms:.2f} ms", "< 5 ms", ms < 5)
    ms = statistics.median(client) / 1000
    row("import of the whole warm-start client (median of 5)", f"{ms:.1f} ms", "< 150 ms", ms < 150)


def main() -> int:
    return run_attacks("contract", foreign_modules, import_times)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
