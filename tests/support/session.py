"""The session's Ray cluster as the tests see it: its CPUs, its custom resource, and the
token file every cluster and server of the run shares (set by conftest's
``pytest_configure``)."""

from __future__ import annotations

import os
from pathlib import Path

CLUSTER_CPUS = 4
# A custom resource, so jobs asking for one (scaling.resources_per_worker) have a node that holds it.
SESSION_RESOURCES = {"raydock_slot": 4}


def session_token_path() -> Path:
    return Path(os.environ["RAY_AUTH_TOKEN_PATH"])
