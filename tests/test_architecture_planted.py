"""The layout's checks fail when they should: each runs on a small tree with a planted
violation of its rule (a cycle stitched by a lazy import, a server import in the contract,
a long module, ...) and names it."""

from __future__ import annotations

from pathlib import Path

from tests.support import architecture as arch
from tests.support.source_tree import Tree, read_tree

# ----------------------------------------------------------------------------- the checks fail when they should


def _plant(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in arch.PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return read_tree(root, arch.PACKAGES)


def test_a_planted_cycle_is_found_even_through_a_lazy_import(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "service/a.py": "from service.b import f\n",
            "service/b.py": "def f():\n    from service import a\n",
        },
    )
    assert arch.cycles(tree) == [["service.a", "service.b"]]


def test_a_planted_server_import_in_the_contract_is_found(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "api/schemas.py": "import fastapi\n",
            "trainers/x.py": "from tuning.search import run\n",
            "tuning/search.py": "from ray.train.v2._internal.execution import context\n",
        },
    )
    found = arch.layering_violations(tree)
    assert any("api.schemas imports fastapi" in v for v in found)
    assert any("trainers.x imports tuning.search" in v for v in found)
    assert {v.split(" imports ")[0] for v in arch.ray_internals_outside_seam(tree)} == {"tuning.search"}


def test_a_planted_long_module_is_found(tmp_path):
    tree = _plant(tmp_path, {"service/big.py": "x = 1\n" * (arch.MAX_LINES + 1)})
    assert arch.long_modules(tree) == [
        f"service.big has {arch.MAX_LINES + 1} lines (limit {arch.MAX_LINES}): split it along its responsibilities"
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
    found = arch.model_specific_imports(tree)
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
            "service/events/ingest.py": "def f():\n    from service.jobs import JobService\n",
            "service/events/logs.py": "from service.db.models import JobRow\nfrom service.events import ingest\n",
            "service/cluster/ray_backend.py": "import ray\nfrom service.settings import Settings\n",
            "service/code/packages.py": "from service.cluster import ray_backend\n",
            "service/http/app.py": "from service.cli.main import app\n",
            "service/cli/main.py": "from service.cli.gc import gc\nfrom service.http.app import create_app\n",
        },
    )
    assert {v.split(" imports ")[0] for v in arch.room_violations(tree)} == {
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
    assert arch.contract_literals(tree) == [
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
            "service/scheduling/preemption.py": "def f():\n    from service.jobs import JobService\n",
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
    assert {v.split(" imports ")[0] for v in arch.room_violations(tree)} == {
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
    assert arch.environment_reads(tree) == [
        "service.attempts line 2: os.environ: read it through service.settings (a field of its section)",
        "service.http.app line 1: os.getenv: read it through service.settings (a field of its section)",
        "service.monitor line 3: os.getenv: read it through service.settings (a field of its section)",
    ]
    assert {v.split(" imports ")[0] for v in arch.room_violations(tree)} == {"service.settings.storage"}


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
    assert [v.split(":")[0] for v in arch.background_loops(tree)] == [
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
    assert {(v.split(" imports ")[0], v.split(": ")[-1]) for v in arch.event_side_violations(tree)} == {
        ("service.events.ingest", apart),
        ("service.events.writers.search_events", apart),
        ("service.events.reads.trials", apart),
        ("service.events.reads.worker_groups", apart),
        ("service.events.reads.series", unchanged),
        ("service.events.reads.replay", unchanged),
    }


def test_planted_imports_between_the_rigs_and_long_rig_modules_are_found(tmp_path):
    _plant(
        tmp_path,
        {
            "bench/scan.py": "from tests.support.session import CLUSTER_CPUS\n",
            "bench/harness/rig.py": "def f():\n    import bench.jobs\n",
            "tests/test_timing.py": "from bench import job_timeline\n",
            "service/leak.py": "from bench.harness.servers import ServerProcess\n",
            "tests/test_fine.py": "from bench.harness import attacks\nfrom tests.support import netns\n",
            "tests/test_big.py": "x = 1\n" * (arch.MAX_LINES + 1),
        },
    )
    tree = read_tree(tmp_path, arch.PACKAGES + arch.RIGS)
    assert sorted(arch.rig_imports(tree)) == [
        "bench.harness.rig imports bench.jobs: bench.harness imports nothing of tests/ nor of bench/ outside it",
        "bench.scan imports tests.support.session.CLUSTER_CPUS: bench/ must not import tests/",
        "bench.scan imports tests.support.session: bench/ must not import tests/",
        "service.leak imports bench.harness.servers.ServerProcess: service/ must not import bench/",
        "service.leak imports bench.harness.servers: service/ must not import bench/",
        "tests.test_timing imports bench.job_timeline: tests/ must not import bench/",
        "tests.test_timing imports bench: tests/ must not import bench/",
    ]
    assert arch.long_modules(tree) == [
        f"tests.test_big has {arch.MAX_LINES + 1} lines (limit {arch.MAX_LINES}): split it along its responsibilities"
    ]


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
    assert [v.split(":")[0] for v in arch.composition_violations(tree)] == [
        "service.attempts builds service.code.packages.CodeStore",
        "service.http.routes.jobs imports service.runtime",
        "service.monitor imports service.jobs",
        "service.scheduling.preemption builds service.job_reads.JobReads",
    ]
