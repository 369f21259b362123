"""User code as the upload tests build it: a project directory whose own ``api`` and
``service`` shadow raydock's, and the ignore-file cases the code policy and the packages
both honour."""

from __future__ import annotations

from pathlib import Path

import yaml

USER_LOOP = '''\
"""A user's loop in a package named `service`, using the user's own `api` package."""
import ray.train

import api
from api.helpers import scale


def main(config):
    for step in range(1, config["steps"] + 1):
        ray.train.report({"step": step, "who": api.WHO, "scaled": scale(step), "api_file": api.__file__})
'''


def write_user_code(root: Path, steps: int = 3) -> Path:
    """A project directory: job.yaml beside code/, which holds `api` and `service`."""
    code = root / "code"
    (code / "api").mkdir(parents=True)
    (code / "api" / "__init__.py").write_text('WHO = "the user\'s api"\n')
    (code / "api" / "helpers.py").write_text("def scale(x):\n    return 10 * x\n")
    (code / "service").mkdir()
    (code / "service" / "__init__.py").write_text("")
    (code / "service" / "train.py").write_text(USER_LOOP)
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "stale.pyc").write_bytes(b"\0" * 64)  # left out by default
    spec = {
        "name": "uploaded",
        "entrypoint": "service.train:main",
        "working_dir": "code",
        "config": {"steps": steps},
        "scaling": {"num_workers": 1},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(spec))
    return root / "job.yaml"


# (ignore files {relative dir: text}, runtime_env.excludes, where a link out of the root sits)
IGNORE_CASES = [
    ({"": ".venv/\n"}, [], ".venv/bin/python"),
    ({"": ".venv/\n!.venv/bin/python\n"}, [], ".venv/bin/python"),
    ({"": ".venv/*\n!.venv/bin/\n"}, [], ".venv/bin/python"),
    ({"": "*.log\n!keep.log\n"}, [], "keep.log"),
    ({"": "*.log\n!keep.log\n"}, [], "other.log"),
    ({"": "data/[ab]*\n"}, [], "data/a1"),
    ({"": "data/[ab]*\n"}, [], "data/c1"),
    ({"": "data/[!a]*\n"}, [], "data/a1"),
    ({"": "\\#notes\n"}, [], "#notes"),
    ({"": "\\!bang\n"}, [], "!bang"),
    ({"": "**/cache/**\n"}, [], "x/cache/y"),
    ({"": "a/**/b\n"}, [], "a/x/y/b"),
    ({"": "/rooted\n"}, [], "x/rooted"),
    ({"": "/rooted\n"}, [], "rooted"),
    ({"": "*\n!*.py\n"}, [], "evil.py"),
    ({"": "*\n!*/\n!*.py\n"}, [], "pkg/evil.py"),
    ({"sub": "*.tmp\n"}, [], "sub/a.tmp"),
    ({"sub": "*.tmp\n"}, [], "a.tmp"),
    ({"sub": "/x\n", "": "!sub/x\n"}, [], "sub/x"),
    ({}, ["secret*"], "secret.txt"),
    ({}, ["sub/"], "sub/deep/link"),
    ({}, ["**/*.key", "!keep/*.key"], "keep/a.key"),
]
