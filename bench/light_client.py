"""The client install: `pip install raydock` (no extras) into a fresh venv, timed, and the
size of what it installed, beside the targets (under ~30 MB and ~20 s), and that neither
Ray nor torch came with it. Needs the package index.

    .venv/bin/python -m bench.light_client
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

from bench.figures import row

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB, TARGET_S = 30, 20


def size_mb(path: Path, bytecode: bool = True) -> float:
    files = (f for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return sum(f.stat().st_size for f in files if bytecode or f.suffix != ".pyc") / 2**20


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="raydock-client-") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.create(env_dir, with_pip=True)
        site = next((env_dir / "lib").glob("python*/site-packages"))
        before, before_source = size_mb(site), size_mb(site, bytecode=False)  # pip itself
        python = env_dir / "bin" / "python"
        started = time.monotonic()
        # A wheel from this checkout first, so the figure is the install a user gets from the index.
        subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(ROOT)], check=True)
        wheel = next(Path(tmp).glob("raydock-*.whl"))
        subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
        took = time.monotonic() - started
        added, source = size_mb(site) - before, size_mb(site, bytecode=False) - before_source
        found = subprocess.run(
            [
                python,
                "-c",
                "import importlib.util as u; print(*[m for m in ('ray', 'torch', 'fastapi') if u.find_spec(m)])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        cli = subprocess.run([env_dir / "bin" / "raydock", "--help"], capture_output=True, text=True)
    print("what | figure | target | ok/FAIL")
    row("pip install raydock (build + install)", f"{took:.1f} s", f"< {TARGET_S} s", took < TARGET_S)
    row("installed size (site-packages, beyond pip)", f"{added:.1f} MB", f"< {TARGET_MB} MB", added < TARGET_MB)
    row("  of which not bytecode (.pyc)", f"{source:.1f} MB", f"< {TARGET_MB} MB", source < TARGET_MB)
    row("ray / torch / fastapi installed", ", ".join(found) or "none", "none", not found)
    row("raydock --help", f"exit {cli.returncode}", "exit 0", cli.returncode == 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
