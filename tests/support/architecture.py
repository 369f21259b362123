"""The checks of the layout, each a function of a source tree (``read_tree``) returning what
breaks its rule: import cycles, one-way imports and a light contract, the Ray internals'
seam, model-agnostic strategies, each room's rule, the line cap, the cluster contract's
names, background work as periodic units, the events' writers apart from their reads, the
environment read through settings, and which of the test rigs (bench/, bench/harness/, tests/)
may import which. tests/test_architecture.py runs them on this repository,
tests/test_architecture_planted.py on small trees with planted violations.
"""

from __future__ import annotations

from pathlib import Path

from api import cluster_contract
from tests.support.source_tree import Tree, internal_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "service", "trainers", "tuning")
# Which of our packages each package may import (besides itself).
ALLOWED_EDGES = {
    "api": set(),
    "service": {"api"},
    "trainers": {"api"},
    "tuning": {"api", "trainers"},
}
# Libraries a package must not import: the contract and SDK stay installable anywhere,
# and what runs on the cluster never reaches for the server's libraries.
FORBIDDEN_LIBRARIES = {
    "api": {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "ray", "torch"},
    "trainers": {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic"},
    "tuning": {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic"},
}
# trainers.zygote.peer: the warm-start client reads the GCS's actor table (ray._raylet's
# GcsClient, ~0.5 s) before anything heavy; trainers.ray_compat imports ray.train (~5 s).
RAY_INTERNALS_SEAM = {"trainers.ray_compat", "trainers.tune_compat", "trainers.zygote.peer"}
# The strategies apply a model's plan and never name a model: model-specific plans live
# with the model (trainers.models.gpt.parallelize), as torchtitan keeps parallelize_llama
# with Llama. Of trainers, the strategies import only themselves (so no trainers.models,
# nor a model module anywhere else in trainers/).
MODEL_AGNOSTIC = "trainers.parallel"
# The server's rooms: what each may import of the rest of service/ (besides itself).
# Nothing outside a room's own list, so a room never reaches back into the job core.
SERVICE_ROOMS: dict[str, set[str]] = {
    "service.db": set(),
    "service.cluster": {"service.settings"},
    "service.events": {
        "service.db",
        "service.cluster",
        "service.lifecycle",
        "service.files",
        "service.stored",
        "service.settings",
        "service.telemetry.instruments",  # counts events taken in and dropped
        "service.eventlog",  # a job's checkpoints, restarts and resizes are logged with what stores them
    },
    "service.code": {"service.db", "service.files", "service.settings", "service.eventlog"},  # code_uploaded
    # Job files on disk: the storage path's layout and the link-safe reads and writes under it.
    "service.files": set(),
    # What the store keeps in JSON columns, read back as typed values: pure, over api/ only.
    "service.stored": set(),
    # Who runs next and where: admission, the queue, fair share, preemption, rank plans. It
    # reads the store, quotas and job files and moves a job only through the lifecycle; it
    # never imports the HTTP side nor the module that talks to Ray (the keeper asks the
    # cluster's capacity through a protocol).
    "service.scheduling": {
        "service.db",
        "service.stored",
        "service.files",
        "service.tenancy",
        "service.lifecycle",
        "service.eventlog",  # a preemption is logged
        "service.settings",
    },
    "service.eventlog": {"service.db", "service.settings"},
    "service.tenancy": {
        "service.db",
        "service.settings",
        "service.eventlog",
        "service.scheduling.fair_share",  # quotas and usage are counted in fair share's terms
    },  # user, token and project changes are audited
    # Counters are a leaf (instruments imports nothing of ours); the scrape-time gauges read the store.
    "service.telemetry": {"service.db"},
    "service.tracking": {
        "service.db",
        "service.files",
        "service.settings",
        "service.telemetry.instruments",
    },
    # Schedules read and write their own rows and submit through the job commands, which the
    # composition root hands them (a protocol): they never import the job core nor the cluster.
    "service.schedules": {"service.db", "service.eventlog", "service.tenancy.caller", "service.settings"},
    # Background work is units and their runner: the composition root hands each unit its step.
    "service.background": set(),
    # The settings' sections read the environment and import nothing else of the server.
    "service.settings": set(),
    # The dashboard's pages are served without the API token, so they hold no data: the room
    # reads nothing of the server; the browser asks /v1 for every number, with the token.
    "service.dashboard": set(),
}
# Rooms only the named modules may import: the command line is a leaf.
PRIVATE_ROOMS = {"service.cli": ()}
RAY_ROOM = "service.cluster"  # the only part of the server that imports ray
MAX_LINES = 400  # for the product and the rigs alike
# The rigs around the product: bench/ and tests/, and bench/harness/ (what tests and
# benchmarks both drive: a real server process, databases, the attacks). The product imports
# no rig; a benchmark no test; the harness nothing of tests/ nor of bench/ outside it; a
# test nothing of bench/ but the harness, so each runs without the other.
RIGS = ("bench", "tests")
HARNESS = "bench.harness"
RIG_IMPORTS_FORBIDDEN = {
    **{package: RIGS for package in PACKAGES},
    "bench": ("tests",),
    "tests": ("bench",),
}
LONG_MODULES_ALLOWED: dict[str, str] = {}  # module -> why it may be longer
# The cluster contract's names (api.cluster_contract): the server and the code on the
# cluster import them, and spell none as a string literal, so one side cannot rename what
# the other reads. Its namespace, "raydock", is left out: the project's name is also its
# loggers' and its folders'.
CONTRACT_SIDES = ("service", "trainers", "tuning")
CONTRACT_NAMES = frozenset(
    {
        *cluster_contract.ENV_NAMES,
        cluster_contract.WARM_NAME_PREFIX,
        cluster_contract.WARM_FACTS_PREFIX,
        cluster_contract.DATA_CACHE_NAME_PREFIX,
        cluster_contract.DATA_CACHE_FACTS_PREFIX,
    }
)
# Background work runs as periodic units (service/background/): no other server module
# starts a thread or loops forever with a sleep, except these, each for one bounded task.
BACKGROUND_ROOM = "service.background"
THREADS_ALLOWED = {
    "service.eventlog.poster": "one per DNS lookup, which asyncio cannot cut off at a deadline",
    "service.files.archive": "one per archive download, ending with it",
    "service.events.log_tails": "the event loop the log tails read on, driven by the monitor's unit",
    "service.cli.main": "the one-off server of `raydock run`, for the command's life",
}
SLEEPING_LOOPS_ALLOWED = ("service.http.routes",)  # a stream polls while its client listens
# The events room has two sides: what stores events (ingestion and its writers, one per
# event type) and what reads them back (trials, replay, series, worker groups). Neither
# imports the other, and the reads change nothing: no status move, event log or counter.
EVENT_WRITE_SIDE = ("service.events.ingest", "service.events.writers")
EVENT_READ_SIDE = ("service.events.reads",)
READS_NEVER_IMPORT = ("service.lifecycle", "service.eventlog", "service.telemetry")
# The server reads its environment through service.settings (typed sections, each bound
# once). These modules read it too, each for a library's own variables, not raydock's.
SETTINGS_ROOM = "service.settings"
ENV_READERS_ALLOWED = {
    "service.cluster.local_cluster": "the Ray head it starts inherits an allowlisted part of this process's environment",
    "service.cluster.ray_backend": "Ray's own token variables (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH), read as Ray's client reads them",
    "service.code.user_code": "RAY_RUNTIME_ENV_IGNORE_GITIGNORE, read as Ray's packaging reads it when it ships the same files",
    "service.tracking.mlflow_runs": "MLflow's HTTP retry variables, set where the operator left them unset",
}
# One composition root builds the server's parts and hands each its collaborators by name
# (the store, the backend, the settings, the code store): no other server module builds
# one, so none can receive a hub to reach them through. (The Ray backend and retention are
# left out: the one-off `raydock gc` process builds its own.) The job commands are imported
# only by the root and by the routes' dependencies that type them; the runtime only by the
# HTTP app, which takes its parts from it.
COMPOSITION_ROOT = "service.runtime"
COMPOSED_PARTS = frozenset(
    {
        "service.jobs.JobCommands",
        "service.job_reads.JobReads",
        "service.events.push.Pushes",
        "service.events.ingest.Ingest",
        "service.events.log_tails.LogTails",
        "service.monitor.Monitor",
        "service.attempts.Attempts",
        "service.scheduling.queue_keeper.QueueKeeper",
        "service.scheduling.preemption.Preemptions",
        "service.code.packages.CodeStore",
        "service.eventlog.deliverer.Deliverer",
        "service.schedules.commands.Schedules",
        "service.schedules.firing.Firing",
        "service.tracking.exporter.Exporter",
    }
)
IMPORTED_ONLY_BY = {
    "service.jobs": {COMPOSITION_ROOT, "service.http.deps"},
    COMPOSITION_ROOT: {"service.http.app"},
}


def cycles(tree: Tree) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph = internal_graph(tree)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _imports_by_package(tree: Tree):
    """(module, its top-level folder, a name it imports, that name's top level), in order."""
    for module, names in sorted(tree.imports.items()):
        package = module.split(".")[0]
        for name in sorted(names):
            yield module, package, name, name.split(".")[0]


def layering_violations(tree: Tree) -> list[str]:
    out = []
    for module, package, name, top in _imports_by_package(tree):
        if top in PACKAGES and top != package and top not in ALLOWED_EDGES[package]:
            out.append(
                f"{module} imports {name}: {package} may import only {sorted(ALLOWED_EDGES[package]) or 'nothing of ours'}"
            )
        if top in FORBIDDEN_LIBRARIES.get(package, ()):
            out.append(f"{module} imports {name}: {package}/ must not import {top}")
    return out


def ray_internals_outside_seam(tree: Tree) -> list[str]:
    out = []
    for module, names in sorted(tree.imports.items()):
        for name in names:
            parts = name.split(".")
            if (
                parts[0] == "ray"
                and any(p in ("_private", "_internal", "_raylet") for p in parts)
                and module not in RAY_INTERNALS_SEAM
            ):
                out.append(f"{module} imports {name}; Ray internals go through {sorted(RAY_INTERNALS_SEAM)}")
    return sorted(set(out))


def model_specific_imports(tree: Tree) -> list[str]:
    out = []
    for module, names in sorted(tree.imports.items()):
        if module != MODEL_AGNOSTIC and not module.startswith(MODEL_AGNOSTIC + "."):
            continue
        for name in sorted(names):
            inside = name == MODEL_AGNOSTIC or name.startswith(MODEL_AGNOSTIC + ".")
            if name.startswith("trainers.") and not inside:
                out.append(
                    f"{module} imports {name}: {MODEL_AGNOSTIC} stays model-agnostic "
                    "(a model's plans live with the model, e.g. trainers.models.gpt.parallelize)"
                )
    return out


def _inside(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def room_violations(tree: Tree) -> list[str]:
    out = []
    for module, names in sorted(tree.imports.items()):
        room = next((r for r in SERVICE_ROOMS if _inside(module, r)), None)
        for name in sorted(names):
            if module.startswith("service.") and name.split(".")[0] == "ray" and not _inside(module, RAY_ROOM):
                out.append(f"{module} imports {name}: only {RAY_ROOM} imports ray")
            if room and _inside(name, "service") and name != "service" and not _inside(name, room):
                if not any(_inside(name, allowed) for allowed in SERVICE_ROOMS[room]):
                    out.append(
                        f"{module} imports {name}: {room} may import only {sorted(SERVICE_ROOMS[room]) or 'nothing'} of service"
                    )
            for private, importers in PRIVATE_ROOMS.items():
                if _inside(name, private) and not _inside(module, private) and module not in importers:
                    out.append(f"{module} imports {name}: nothing outside {private} imports it")
    return sorted(set(out))


def long_modules(tree: Tree) -> list[str]:
    return [
        f"{m} has {n} lines (limit {MAX_LINES}): split it along its responsibilities"
        for m, n in sorted(tree.lines.items())
        if n > MAX_LINES and m not in LONG_MODULES_ALLOWED
    ]


def contract_literals(tree: Tree) -> list[str]:
    """A contract name spelled as a string (an f-string's text parts too) on either side."""
    return sorted(
        f"{m} spells {name!r}: import it from api.cluster_contract"
        for m, literals in tree.literals.items()
        if m.split(".")[0] in CONTRACT_SIDES
        for name in literals & CONTRACT_NAMES
    )


def background_loops(tree: Tree) -> list[str]:
    out = []
    for module, found in sorted(tree.loops.items()):
        if not _inside(module, "service") or _inside(module, BACKGROUND_ROOM):
            continue
        for where in found:
            if "thread" in where and module in THREADS_ALLOWED:
                continue
            if "sleeps" in where and any(_inside(module, r) for r in SLEEPING_LOOPS_ALLOWED):
                continue
            out.append(f"{module} {where}: make it a periodic unit (service/background/) wired in service/runtime.py")
    return out


def event_side_violations(tree: Tree) -> list[str]:
    out = []
    for module, names in sorted(tree.imports.items()):
        for side, other, never in (
            (EVENT_WRITE_SIDE, EVENT_READ_SIDE, ()),
            (EVENT_READ_SIDE, EVENT_WRITE_SIDE, READS_NEVER_IMPORT),
        ):
            if not any(_inside(module, m) for m in side):
                continue
            for name in sorted(names):
                if any(_inside(name, m) for m in other):
                    out.append(f"{module} imports {name}: the events' writers and reads never import each other")
                elif any(_inside(name, m) for m in never):
                    out.append(f"{module} imports {name}: the events' reads change nothing")
    return out


def environment_reads(tree: Tree) -> list[str]:
    return [
        f"{module} {where}: read it through service.settings (a field of its section)"
        for module, found in sorted(tree.env_reads.items())
        if _inside(module, "service") and not _inside(module, SETTINGS_ROOM) and module not in ENV_READERS_ALLOWED
        for where in found
    ]


def rig_imports(tree: Tree) -> list[str]:
    out = []
    for module, package, name, top in _imports_by_package(tree):
        if _inside(module, HARNESS):
            if top == "tests" or (top == "bench" and not _inside(name, HARNESS)):
                out.append(f"{module} imports {name}: {HARNESS} imports nothing of tests/ nor of bench/ outside it")
        elif top in RIG_IMPORTS_FORBIDDEN.get(package, ()) and not (package == "tests" and _inside(name, HARNESS)):
            out.append(f"{module} imports {name}: {package}/ must not import {top}/")
    return out


def composition_violations(tree: Tree) -> list[str]:
    out = []
    for module, called in sorted(tree.calls.items()):
        if _inside(module, "service") and module != COMPOSITION_ROOT:
            out += [
                f"{module} builds {name}: only {COMPOSITION_ROOT} builds the parts" for name in called & COMPOSED_PARTS
            ]
    for module, names in sorted(tree.imports.items()):
        for private, importers in IMPORTED_ONLY_BY.items():
            if _inside(module, "service") and module != private and module not in importers:
                if any(_inside(name, private) for name in names):
                    out.append(f"{module} imports {private}: only {sorted(importers)} may (its parts come by name)")
    return sorted(set(out))
