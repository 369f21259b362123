"""Gitignore-style patterns, as Ray applies ``.gitignore``, ``.rayignore`` and
``runtime_env.excludes`` when it zips a job's code (gitwildmatch rules).

The user-code policy (``service/code/user_code.py``) skips what Ray would leave out, so it
must never skip *more* than Ray: a file it skips goes unchecked. So a pattern whose
meaning is not certain here (character classes, escapes, ``**`` inside a name) skips
nothing, and a file of patterns with a ``!`` re-include skips nothing at all.
"""

from __future__ import annotations

import re
from typing import Callable


def compile_patterns(lines: list[str]) -> Callable[[str], bool]:
    """A test for '/'-separated paths relative to where the patterns apply."""
    patterns = [p for line in lines if (p := _clean(line))]
    if any(p.startswith("!") for p in patterns):
        return lambda path: False
    regexes = [r for p in patterns if (r := _regex(p)) is not None]
    if not regexes:
        return lambda path: False
    combined = re.compile("|".join(f"(?:{r})" for r in regexes))
    return lambda path: combined.fullmatch(path) is not None


def _clean(line: str) -> str:
    line = line.rstrip("\n")
    if line.startswith("#"):
        return ""
    return line.rstrip(" ") if not line.endswith("\\ ") else line


def _regex(pattern: str) -> str | None:
    if any(c in pattern for c in "[]\\"):
        return None
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    if not pattern:
        return None
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    parts = pattern.split("/")
    out: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            # a/**/b: zero or more directories; trailing a/**: everything below.
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        if "**" in part:
            return None
        piece = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in part)
        out.append(piece if last else piece + "/")
    body = "".join(out)
    prefix = "" if anchored else "(?:.+/)?"
    # A match on a directory covers everything below it; "name/" matches only below.
    suffix = "/.*" if dir_only else "(?:/.*)?"
    return prefix + body + suffix
