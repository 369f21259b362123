"""Which code a name imports in a job's processes: raydock's packages, or the job's own.

raydock's top-level packages (``api``, ``service``, ``trainers``, ``tuning``) have names
that users' projects have too, and Ray puts the job's working directory *first* on the
path of every process of the job (its driver's ``cwd`` and ``sys.path[0]``, and the
front of ``PYTHONPATH`` in every worker; ray/_private/runtime_env/working_dir.py). So a
user directory holding ``api/`` would be what ``import api`` finds in raydock's own
driver and Train controller. With an editable install that went unnoticed, by accident:
its import hook grafts ``api.schemas`` from the checkout onto whichever ``api`` came
first. A regular install has no such hook.

``pin`` (run when the ``trainers`` package is imported, which every process of a job
does first: the drivers are ``trainers.driver`` and ``tuning.search_driver``, Ray's
workers run ``trainers.worker_setup`` before any task) puts a finder at the front of
``sys.meta_path`` that imports these names from where raydock is installed. Processes
that run only raydock (the drivers, the Train controller, a search's trials) keep it.

A Train worker runs the user's loop: ``yield_to_job`` (``trainers.user_loop``) first
hands each pinned name that the job's code also defines back to the job's code, and
drops raydock's modules of that name from ``sys.modules`` (raydock's code already loaded
keeps the objects it imported). The user's ``import api`` then finds the user's package.
What the worker needs of raydock after that is already imported.

``trainers`` and ``tuning`` cannot be handed back: the drivers and Ray's workers find
them by name before any of this runs. An uploaded package holding them at its top level
is refused at submit (``api.code_package.RESERVED_NAMES``, checked by ``service/code/packages.py``).
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

RAYDOCK_PACKAGES = ("api", "service", "trainers", "tuning")
ROOT = str(Path(__file__).resolve().parent.parent)  # where raydock's packages are installed


class _OwnPackages(MetaPathFinder):
    """Finds raydock's top-level packages where raydock is installed, before any path entry."""

    def __init__(self) -> None:
        self.names = set(RAYDOCK_PACKAGES)

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if fullname in self.names:
            return PathFinder.find_spec(fullname, [ROOT])
        return None


_FINDER = _OwnPackages()


def pin() -> None:
    """From now on, raydock's package names import raydock's packages in this process."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def yield_to_job() -> list[str]:
    """Hand the package names that the job's code defines back to it; returns them."""
    others = [p for p in sys.path if _real(p or os.getcwd()) != _real(ROOT)]
    given = []
    for name in sorted(_FINDER.names):
        spec = PathFinder.find_spec(name, others)
        if spec is None or _from_raydock(spec):
            continue
        _FINDER.names.discard(name)
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
        given.append(name)
    return given


def _from_raydock(spec: ModuleSpec) -> bool:
    places = list(spec.submodule_search_locations or []) or [spec.origin or ""]
    return all(_real(p).startswith(_real(ROOT) + os.sep) for p in places if p)


def _real(path: str) -> str:
    return os.path.realpath(path)
