"""The layout is a test: imports flow one way, no module imports itself back, the
contract stays light, Ray internals have one seam, modules stay small, the names the
server and the cluster share are spelled only in ``api.cluster_contract``, the
server's background work is periodic units run by ``service.background`` (no thread or
sleeping loop of its own elsewhere), the events' writers and reads never import each
other, the server reads its environment only through ``service.settings``, and one
composition root (``service.runtime``) builds the server's parts and hands each its
collaborators by name.

Imports are read from the source (lazy imports inside functions too), so a circle
stitched with a late import is still a circle. The checks are functions of a source
tree; the last tests run them on a small tree with a planted cycle and a planted
fastapi import, to show they fail when they should.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from api import cluster_contract

ROOT = Path(__file__).resolve().parents[1]
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
RAY_INTERNALS_SEAM = {"trainers.ray_compat", "trainers.zygote.peer"}
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
MAX_LINES = 400
LONG_MODULES_ALLOWED: dict[str, str] = {}  # module -> why it may be longer
# The cluster contract's names (api.cluster_contract): the server and the code on the
# cluster import them, and spell none as a string literal, so one side cannot rename what
# the other reads. Its namespace, "raydock", is left out: the project's name is also its
# loggers' and its folders'.
CONTRACT_SIDES = ("service", "trainers", "tuning")
CONTRACT_NAMES = frozenset(
    {*cluster_contract.ENV_NAMES, cluster_contract.WARM_NAME_PREFIX, cluster_contract.WARM_FACTS_PREFIX}
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
ENV_READS = frozenset({"environ", "environb", "getenv", "getenvb"})
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
        "service.tracking.exporter.Exporter",
    }
)
IMPORTED_ONLY_BY = {
    "service.jobs": {COMPOSITION_ROOT, "service.http.deps"},
    COMPOSITION_ROOT: {"service.http.app"},
}


@dataclass
class Tree:
    imports: dict[str, set[str]] = field(default_factory=dict)  # module -> imported names
    lines: dict[str, int] = field(default_factory=dict)
    literals: dict[str, set[str]] = field(default_factory=dict)  # module -> its string constants
    loops: dict[str, list[str]] = field(default_factory=dict)  # module -> its threads and sleeping loops
    env_reads: dict[str, list[str]] = field(default_factory=dict)  # module -> where it reads os.environ
    calls: dict[str, set[str]] = field(default_factory=dict)  # module -> the imported names it calls


def read_tree(root: Path, packages=PACKAGES) -> Tree:
    tree = Tree()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_pkg else parts)
            source = path.read_text()
            tree.lines[module] = source.count("\n")
            parsed = ast.parse(source)
            tree.imports[module] = _imports(parsed, module, is_pkg)
            tree.literals[module] = {
                n.value for n in ast.walk(parsed) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            tree.loops[module] = _loops(parsed)
            tree.env_reads[module] = _env_reads(parsed)
            tree.calls[module] = _calls(parsed, module, is_pkg)
    return tree


def _env_reads(node: ast.AST) -> list[str]:
    """Where a module reads the process environment: ``os.environ`` / ``os.getenv`` (``os``
    under any name), or ``environ`` / ``getenv`` imported from ``os``."""
    os_names = {
        a.asname or a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names if a.name == "os"
    }
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ENV_READS and getattr(n.value, "id", None) in os_names:
            out.append(f"line {n.lineno}: os.{n.attr}")
        elif isinstance(n, ast.ImportFrom) and n.module == "os" and not n.level:
            out.extend(f"line {n.lineno}: os.{a.name}" for a in n.names if a.name in ENV_READS)
    return out


def _loops(node: ast.AST) -> list[str]:
    """Where a module starts a thread (``threading.Thread(``, ``Thread(``) or loops forever
    with a sleep inside (``while True:`` ... ``sleep(`` with no ``break`` or ``return``): a
    background loop of its own. A batch loop that pauses between batches and ends is not."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "Thread":
            out.append(f"line {n.lineno}: a thread")
        elif isinstance(n, ast.While) and isinstance(n.test, ast.Constant) and n.test.value is True:
            calls = (c for c in ast.walk(n) if isinstance(c, ast.Call))
            ends = any(isinstance(c, (ast.Break, ast.Return)) for c in ast.walk(n))
            if not ends and any(
                (getattr(c.func, "attr", None) or getattr(c.func, "id", None)) == "sleep" for c in calls
            ):
                out.append(f"line {n.lineno}: a `while True` loop that sleeps")
    return out


def _calls(node: ast.AST, module: str, is_pkg: bool) -> set[str]:
    """The imported names a module calls, as full names: ``Monitor(...)`` after ``from
    service.monitor import Monitor``, ``monitor.Monitor(...)`` after ``from service import monitor``."""
    local: dict[str, str] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for a in n.names:
                local[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom):
            base = _from_base(n, module, is_pkg)
            local.update({a.asname or a.name: f"{base}.{a.name}" for a in n.names})
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            parts, f = [], n.func
            while isinstance(f, ast.Attribute):
                parts.insert(0, f.attr)
                f = f.value
            if isinstance(f, ast.Name) and f.id in local:
                out.add(".".join([local[f.id], *parts]))
    return out


def _from_base(n: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved."""
    if not n.level:
        return n.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (n.level - 1)]
    return ".".join(base + ([n.module] if n.module else []))


def _imports(node: ast.AST, module: str, is_pkg: bool) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):  # every import, module level or inside a function
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            name = _from_base(n, module, is_pkg)
            out.add(name)
            out.update(f"{name}.{a.name}" for a in n.names)
    return out


def internal_graph(tree: Tree) -> dict[str, set[str]]:
    """module -> our modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    graph: dict[str, set[str]] = {}
    for module, names in tree.imports.items():
        graph[module] = {n for n in names if n in tree.imports and n != module}
    return graph


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


def layering_violations(tree: Tree) -> list[str]:
    out = []
    for module, names in sorted(tree.imports.items()):
        package = module.split(".")[0]
        for name in sorted(names):
            top = name.split(".")[0]
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


# ----------------------------------------------------------------------------- the house


def test_no_import_cycles():
    assert cycles(read_tree(ROOT)) == []


def test_packages_import_one_way_and_the_contract_stays_light():
    assert layering_violations(read_tree(ROOT)) == []


def test_ray_internals_only_behind_the_seam():
    assert ray_internals_outside_seam(read_tree(ROOT)) == []


def test_parallel_strategies_name_no_model():
    assert model_specific_imports(read_tree(ROOT)) == []


def test_each_room_of_the_server_keeps_its_rule():
    assert room_violations(read_tree(ROOT)) == []


def test_no_module_over_the_line_limit():
    assert long_modules(read_tree(ROOT)) == []


def test_the_cluster_contract_is_spelled_in_one_place():
    assert contract_literals(read_tree(ROOT)) == []


def test_background_work_runs_only_as_periodic_units():
    assert background_loops(read_tree(ROOT)) == []


def test_the_events_writers_and_reads_keep_apart():
    assert event_side_violations(read_tree(ROOT)) == []


def test_the_server_reads_its_environment_through_settings():
    assert environment_reads(read_tree(ROOT)) == []


def test_one_composition_root_builds_the_parts():
    assert composition_violations(read_tree(ROOT)) == []


def test_http_app_lives_on_the_server_side():
    tree = read_tree(ROOT)
    assert not [
        m for m in tree.imports if m.startswith("api.") and m.split(".")[1] in ("app", "routes", "deps", "http")
    ]
    assert "service.http.app" in tree.imports


# ----------------------------------------------------------------------------- the checks fail when they should


def _plant(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return read_tree(root)


def test_a_planted_cycle_is_found_even_through_a_lazy_import(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/a.py": "from service.b import f\n",
            "service/b.py": "def f():\n    from service import a\n",
        },
    )
    assert cycles(tree) == [["service.a", "service.b"]]


def test_a_planted_server_import_in_the_contract_is_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "api/schemas.py": "import fastapi\n",
            "trainers/x.py": "from tuning.search import run\n",
            "tuning/search.py": "from ray.train.v2._internal.execution import context\n",
        },
    )
    found = layering_violations(tree)
    assert any("api.schemas imports fastapi" in v for v in found)
    assert any("trainers.x imports tuning.search" in v for v in found)
    assert {v.split(" imports ")[0] for v in ray_internals_outside_seam(tree)} == {"tuning.search"}


def test_a_planted_long_module_is_found(tmp_path):
    tree = _plant(tmp_path, {"service/big.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_modules(tree) == [
        f"service.big has {MAX_LINES + 1} lines (limit {MAX_LINES}): split it along its responsibilities"
    ]


def test_a_planted_model_import_in_the_strategies_is_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "trainers/parallel/__init__.py": "",
            "trainers/parallel/tensor.py": "from trainers.models.gpt import gpt_tensor_plan\n",
            "trainers/parallel/pipeline.py": "def f():\n    import trainers.models\n",
            "trainers/parallel/fsdp.py": "from trainers.gpt import GPT\n",
            "trainers/parallel/ddp.py": "from trainers.parallel.plan import ModelPlan\n",
            "trainers/models/gpt.py": "from trainers.parallel.plan import register_plan\n",
        },
    )
    found = model_specific_imports(tree)
    assert {v.split(" imports ")[0] for v in found} == {
        "trainers.parallel.tensor",
        "trainers.parallel.pipeline",
        "trainers.parallel.fsdp",
    }


def test_planted_room_violations_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/jobs.py": "import ray\n",
            "service/db/models.py": "from service.settings import Settings\n",
            "service/events/ingest.py": "def f():\n    from service.jobs import JobCommands\n",
            "service/events/logs.py": "from service.db.models import JobRow\nfrom service.events import ingest\n",
            "service/cluster/ray_backend.py": "import ray\nfrom service.settings import Settings\n",
            "service/code/packages.py": "from service.cluster import ray_backend\n",
            "service/http/app.py": "from service.cli.main import app\n",
            "service/cli/main.py": "from service.cli.gc import gc\nfrom service.http.app import create_app\n",
        },
    )
    assert {v.split(" imports ")[0] for v in room_violations(tree)} == {
        "service.jobs",
        "service.db.models",
        "service.events.ingest",
        "service.code.packages",
        "service.http.app",
    }


def test_planted_contract_names_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/attempts.py": 'def env(uri):\n    return {"RAYDOCK_LAUNCH_URI": uri}\n',
            "trainers/zygote/peer.py": 'def name(node):\n    return f"raydock-warm-{node}"\n',
            "tuning/x.py": 'import os\nwarm = os.environ.get("RAYDOCK_WARM_START")\n',
            # Imported, and named in prose: both fine.
            "trainers/launch.py": '"""Reads ``RAYDOCK_LAUNCH_URI``."""\nfrom api.cluster_contract import LAUNCH_URI_ENV\n',
            "api/cluster_contract.py": 'LAUNCH_URI_ENV = "RAYDOCK_LAUNCH_URI"\n',
        },
    )
    assert contract_literals(tree) == [
        "service.attempts spells 'RAYDOCK_LAUNCH_URI': import it from api.cluster_contract",
        "trainers.zygote.peer spells 'raydock-warm-': import it from api.cluster_contract",
        "tuning.x spells 'RAYDOCK_WARM_START': import it from api.cluster_contract",
    ]


def test_planted_violations_of_the_scheduling_files_and_stored_rooms_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            # Scheduling reaches for the HTTP side, the Ray module and the job core.
            "service/scheduling/admission.py": "from service.http.deps import readable_job\n",
            "service/scheduling/queue_keeper.py": "from service.cluster.ray_backend import RayBackend\n",
            "service/scheduling/preemption.py": "def f():\n    from service.jobs import JobCommands\n",
            # Allowed: the store, stored shapes, job files, quotas, the lifecycle, itself.
            "service/scheduling/queue.py": (
                "from service.db.models import JobRow\nfrom service.stored.specs import stored_spec\n"
                "from service.files import storage\nfrom service.tenancy import quotas\n"
                "from service import lifecycle\nfrom service.scheduling import admission\n"
            ),
            # Job files and stored shapes import nothing else of service.
            "service/files/storage.py": "from service.settings import Settings\n",
            "service/files/localfs.py": "from service.files import nofollow\n",
            "service/stored/phases.py": "from service.db.models import JobRow\n",
            "service/stored/specs.py": "from api.schemas import JobSpec\n",
            # Tenancy takes fair share's terms, and nothing else of scheduling.
            "service/tenancy/quotas.py": "from service.scheduling.fair_share import Quota\n",
            "service/tenancy/usage.py": "from service.scheduling.queue import Marks\n",
        },
    )
    assert {v.split(" imports ")[0] for v in room_violations(tree)} == {
        "service.scheduling.admission",
        "service.scheduling.queue_keeper",
        "service.scheduling.preemption",
        "service.files.storage",
        "service.stored.phases",
        "service.tenancy.usage",
    }


def test_planted_environment_reads_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/attempts.py": 'import os\nfaults = os.environ.get("RAYDOCK_TEST_FAULTS", "")\n',
            "service/http/app.py": 'from os import getenv\nopen_docs = getenv("RAYDOCK_OPEN_DOCS")\n',
            "service/monitor.py": 'import os as _os\ndef tick():\n    return _os.getenv("RAYDOCK_MONITOR_INTERVAL_S")\n',
            # The settings' sections read it; a named library variable may be read; prose is no read.
            "service/settings/faults.py": 'import os\nfaults = os.environ.get("RAYDOCK_TEST_FAULTS")\n',
            "service/cluster/ray_backend.py": 'import os\ntoken = os.environ.get("RAY_AUTH_TOKEN")\n',
            "service/jobs.py": '"""Reads nothing of os.environ."""\nimport os\npath = os.path.join("a", "b")\n',
            "service/settings/storage.py": "from service.files import storage\n",
        },
    )
    assert environment_reads(tree) == [
        "service.attempts line 2: os.environ: read it through service.settings (a field of its section)",
        "service.http.app line 1: os.getenv: read it through service.settings (a field of its section)",
        "service.monitor line 3: os.getenv: read it through service.settings (a field of its section)",
    ]
    assert {v.split(" imports ")[0] for v in room_violations(tree)} == {"service.settings.storage"}


def test_planted_background_loops_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/sweeper.py": (
                "import asyncio\nasync def run():\n    while True:\n        await asyncio.sleep(5)\n"
            ),
            "service/poller.py": "import threading\nthreading.Thread(target=print, daemon=True).start()\n",
            "service/pages.py": "def pages(read):\n    while True:\n        if not read():\n            break\n",
            "service/purge.py": (
                "import time\ndef purge(more):\n    while True:\n        if not more():\n            break\n"
                "        time.sleep(0.1)\n"
            ),
            "service/http/routes/logs.py": "import time\ndef stream():\n    while True:\n        time.sleep(1)\n",
            "service/background/runner.py": (
                "import asyncio, threading\nthreading.Thread(target=print)\n"
                "async def run():\n    while True:\n        await asyncio.sleep(1)\n"
            ),
        },
    )
    assert [v.split(":")[0] for v in background_loops(tree)] == [
        "service.poller line 2",
        "service.sweeper line 3",
    ]


def test_planted_crossings_of_the_events_writers_and_reads_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/events/ingest.py": "from service.events.reads.trials import TrialService\n",
            "service/events/writers/search_events.py": "def f():\n    from service.events.reads import series\n",
            "service/events/reads/trials.py": "from service.events.writers.batch import Batch\n",
            "service/events/reads/series.py": "from service import lifecycle\nfrom service.events import rollups\n",
            "service/events/reads/replay.py": "import service.telemetry.instruments\n",
            "service/events/reads/worker_groups.py": "from service.events.ingest import Ingest\n",
            # Allowed: both sides share the room's other modules and the store.
            "service/events/writers/job_events.py": "from service.events import rollups, limits\nfrom service import lifecycle\n",
            "service/events/reads/__init__.py": "from service.db.models import JobRow\n",
        },
    )
    apart, unchanged = "the events' writers and reads never import each other", "the events' reads change nothing"
    assert {(v.split(" imports ")[0], v.split(": ")[-1]) for v in event_side_violations(tree)} == {
        ("service.events.ingest", apart),
        ("service.events.writers.search_events", apart),
        ("service.events.reads.trials", apart),
        ("service.events.reads.worker_groups", apart),
        ("service.events.reads.series", unchanged),
        ("service.events.reads.replay", unchanged),
    }


def test_planted_composition_violations_are_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            # The monitor reaches for the job commands, attempts build a code store of their own,
            # a route takes the runtime, and a lazy import still counts.
            "service/monitor.py": "from service.jobs import JobCommands\n",
            "service/attempts.py": "from service.code import packages\ndef f(s):\n    return packages.CodeStore(s, s)\n",
            "service/http/routes/jobs.py": "def f(request):\n    from service.runtime import Runtime\n",
            "service/scheduling/preemption.py": "import service.job_reads\nr = service.job_reads.JobReads(1, 2, 3)\n",
            # Allowed: the root builds, the routes' dependencies type the commands, the app takes the runtime.
            "service/runtime.py": "from service.jobs import JobCommands\nfrom service.monitor import Monitor\nMonitor(JobCommands())\n",
            "service/http/deps.py": "from service.jobs import JobCommands\n",
            "service/http/app.py": "from service.runtime import build_runtime\n",
        },
    )
    assert [v.split(":")[0] for v in composition_violations(tree)] == [
        "service.attempts builds service.code.packages.CodeStore",
        "service.http.routes.jobs imports service.runtime",
        "service.monitor imports service.jobs",
        "service.scheduling.preemption builds service.job_reads.JobReads",
    ]
