"""What a test reads of a running process: its environment, from /proc."""

from __future__ import annotations

from pathlib import Path


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (empty when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
