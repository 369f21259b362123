"""User code under a policy: what a job may ship from the server's disk, which
runtime_env it may ask for, and an entrypoint check that runs none of the job's code.

A server of the module's own, on the session's Ray head, with a code root in a temp dir
and small caps; every refusal is a 422 with its code, and nothing is stored.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from api.errors import InvalidSpec
from api.schemas import FailureCause, JobStatus, parse_job_spec
from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from service.cluster.ray_backend import RayBackend
from service.code.user_code import check_user_code, locate
from service.db.engine import make_engine, make_sessionmaker
from service.runtime import compose
from service.settings import Settings
from tests.support.user_code import IGNORE_CASES

MAX_FILES, MAX_BYTES = 40, 64 * 1024
TRIPWIRE = "from pathlib import Path\nPath(__file__).with_name('IMPORTED').write_text('ran')\n"


def make_code_root(root: Path) -> None:
    """A package whose ``__init__`` files leave a marker when run; a tree over the
    file cap; one over the byte cap; one with a link to a file outside the root."""
    pkg = root / "app" / "tripwire"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(TRIPWIRE)
    (pkg / "sub" / "__init__.py").write_text(TRIPWIRE)
    (pkg / "train.py").write_text("def train(config):\n    pass\n")
    many = root / "many"
    many.mkdir()
    for i in range(MAX_FILES + 5):
        (many / f"f{i}.py").write_text("x = 1\n")
    big = root / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(b"\0" * (MAX_BYTES * 2))
    (big / "small.py").write_text("x = 1\n")
    linked = root / "linked"
    linked.mkdir()
    (linked / "secrets").symlink_to(root.parent / "outside.txt")
    (root.parent / "outside.txt").write_text("server secret\n")


@pytest.fixture(scope="module")
def policy_server(ray_head, tmp_path_factory):
    base = tmp_path_factory.mktemp("policy")
    root = base / "code"
    make_code_root(root)
    env = {
        "RAYDOCK_CODE_ROOT": str(root),
        "RAYDOCK_CODE_MAX_FILES": str(MAX_FILES),
        "RAYDOCK_CODE_MAX_BYTES": str(MAX_BYTES),
    }
    server = ServerProcess(base / "server", ray_head.dashboard_url, extra_env=env).start()
    yield server, root
    server.stop()


def spec(root: Path, entrypoint: str = "tripwire.train:train", **overrides) -> dict:
    body = {"name": "policy", "entrypoint": entrypoint, "working_dir": str(root / "app"), "scaling": {"num_workers": 1}}
    body.update(overrides)
    return body


CASES = [
    ("the server's root directory", dict(working_dir="/"), "working_dir_not_found", "code root"),
    ("a path that climbs out of the root", dict(working_dir="app/../../.."), "working_dir_not_found", "code root"),
    (
        "the server's ~/.ssh as py_modules",
        dict(runtime_env={"py_modules": ["~/.ssh"]}),
        "py_module_not_found",
        "code root",
    ),
    ("a server path as py_modules", dict(runtime_env={"py_modules": ["/etc"]}), "py_module_not_found", "/etc"),
    (
        "a file URI as py_modules",
        dict(runtime_env={"py_modules": ["file:///etc"]}),
        "py_module_not_found",
        "file:///etc",
    ),
    (
        "a runtime_env key not on the list",
        dict(runtime_env={"conda": {"dependencies": ["numpy"]}}),
        "runtime_env_key_not_allowed",
        "conda",
    ),
    (
        "working_dir inside runtime_env",
        dict(runtime_env={"working_dir": "/"}),
        "runtime_env_key_not_allowed",
        "top-level `working_dir`",
    ),
    (
        "a RAYDOCK_* variable",
        dict(runtime_env={"env_vars": {"RAYDOCK_EVENTS_URL": "http://evil"}}),
        "env_var_not_allowed",
        "RAYDOCK_EVENTS_URL",
    ),
    (
        "a RAY_* variable",
        dict(runtime_env={"env_vars": {"RAY_ADDRESS": "10.0.0.1:6379"}}),
        "env_var_not_allowed",
        "RAY_ADDRESS",
    ),
    (
        "a requirements file on the server",
        dict(runtime_env={"pip": "/etc/requirements.txt"}),
        "runtime_env_invalid",
        "list of requirement",
    ),
    (
        "an installer option",
        dict(runtime_env={"pip": ["--index-url=http://evil/simple", "numpy"]}),
        "runtime_env_invalid",
        "--index-url",
    ),
    ("a link out of the code root", dict(working_dir="linked"), "code_link_outside_root", "secrets"),
    ("too many files", dict(working_dir="many"), "code_too_large", "RAYDOCK_CODE_MAX_FILES"),
    ("too many bytes", dict(working_dir="big"), "code_too_large", "big/weights.bin"),
    (
        "caps count py_modules too",
        dict(runtime_env={"py_modules": ["big"]}),
        "code_too_large",
        "RAYDOCK_CODE_MAX_BYTES",
    ),
]


@pytest.mark.parametrize("what,changes,code,hint", CASES, ids=[c[0] for c in CASES])
def test_refused_with_a_code_and_nothing_stored(policy_server, what, changes, code, hint):
    server, root = policy_server
    http = httpx.Client(base_url=server.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=spec(root, **changes))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    assert hint in err["message"], err["message"]
    assert err["details"] and err["details"][0]["loc"][0] in ("working_dir", "runtime_env")
    assert http.get("/v1/jobs").json()["total"] == before


def test_excluded_files_do_not_count(policy_server):
    """What Ray leaves out (runtime_env.excludes) is not held against the caps: the
    check gets past the tree to the entrypoint, which is what refuses."""
    server, root = policy_server
    r = httpx.post(
        f"{server.url}/v1/jobs", json=spec(root, "nothere:f", working_dir="big", runtime_env={"excludes": ["*.bin"]})
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "entrypoint_not_found"


def test_entrypoint_check_runs_no_package_code(policy_server):
    server, root = policy_server
    http = httpx.Client(base_url=server.url, timeout=30)
    for entrypoint in ("tripwire.nothing:f", "tripwire.sub.deeper:f", "this.nothing:f"):
        r = http.post("/v1/jobs", json=spec(root, entrypoint))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "entrypoint_not_found"
        assert entrypoint.split(":")[0] in r.json()["error"]["message"]
    assert not (root / "app" / "tripwire" / "IMPORTED").exists()
    assert not (root / "app" / "tripwire" / "sub" / "IMPORTED").exists()
    log = (server.data_dir / "server.log").read_text()
    assert "Beautiful is better than ugly" not in log  # `import this` prints the Zen of Python


def test_locate_follows_packages_by_path_alone(tmp_path):
    root = tmp_path / "code"
    make_code_root(root)
    app = str(root / "app")
    assert locate("tripwire.train", [app])
    assert locate("tripwire.sub", [app])
    assert not locate("tripwire.nothing", [app])
    assert not locate("tripwire.train.deeper", [app])  # a module has no submodules
    assert not locate("this.nothing", sys.path)
    assert locate("json.decoder", sys.path)
    assert not (root / "app" / "tripwire" / "IMPORTED").exists()
    assert "tripwire" not in sys.modules


def test_paths_are_pinned_to_what_was_checked(tmp_path):
    """A relative working_dir is taken from the code root; the stored spec names the
    resolved directory, so what Ray ships is what was checked."""
    root = tmp_path / "code"
    make_code_root(root)
    (root / "current").symlink_to(root / "app")
    settings = Settings(storage={"data_dir": tmp_path / "data"}, code={"code_root": str(root)})
    job = parse_job_spec(spec(root, working_dir="current", runtime_env={"py_modules": ["app/tripwire"]}))
    check_user_code(job, settings)
    assert job.working_dir == str(root / "app")
    assert job.runtime_env["py_modules"] == [str(root / "app" / "tripwire")]

    no_root = Settings(storage={"data_dir": tmp_path / "data"})
    with pytest.raises(InvalidSpec) as refused:
        check_user_code(parse_job_spec(spec(root)), no_root)
    assert refused.value.code == "code_root_not_configured"
    assert "RAYDOCK_CODE_ROOT" in refused.value.message


def _shipped_by_ray(project: Path, excludes: list[str], rel: str) -> bool:
    """Whether Ray's own packaging (the walk it zips a working_dir with) takes ``rel``."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    seen: set[str] = set()
    _dir_travel(project, [_get_excludes(project, excludes)], lambda p: seen.add(str(p)), include_gitignore=True)
    return str(project / rel) in seen


@pytest.mark.parametrize(
    "ignore_files, excludes, link", IGNORE_CASES, ids=[c[2] + str(i) for i, c in enumerate(IGNORE_CASES)]
)
def test_what_ray_leaves_out_goes_unchecked_and_nothing_more(tmp_path, ignore_files, excludes, link):
    """The policy walks a working_dir as Ray zips it, with the engine Ray matches
    .gitignore, .rayignore and runtime_env.excludes with: a link out of the root is
    refused exactly when Ray's own packaging would ship it (`!`, `[...]`, `**`, escapes,
    anchored and nested patterns)."""
    root = tmp_path / "code"
    project = root / "project"
    (project / link).parent.mkdir(parents=True, exist_ok=True)
    (project / link).symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("a file of the server\n")
    (project / "main.py").write_text("def train(config):\n    pass\n")
    for where, text in ignore_files.items():
        (project / where).mkdir(parents=True, exist_ok=True)
        (project / where / ".gitignore").write_text(text)
    settings = Settings(storage={"data_dir": tmp_path / "data"}, code={"code_root": str(root)})
    job = parse_job_spec(spec(root, "main:train", working_dir="project", runtime_env={"excludes": excludes}))
    shipped = _shipped_by_ray(project, excludes, link)
    if not shipped:
        check_user_code(job, settings)
        return
    with pytest.raises(InvalidSpec) as refused:
        check_user_code(job, settings)
    assert refused.value.code == "code_link_outside_root"
    assert link in refused.value.message


def test_a_pattern_ray_and_git_read_differently_is_refused(tmp_path):
    root = tmp_path / "code"
    (root / "project").mkdir(parents=True)
    (root / "project" / "main.py").write_text("def train(config):\n    pass\n")
    (root / "project" / ".rayignore").write_text("notes\\ \n")
    settings = Settings(storage={"data_dir": tmp_path / "data"}, code={"code_root": str(root)})
    with pytest.raises(InvalidSpec) as refused:
        check_user_code(parse_job_spec(spec(root, "main:train", working_dir="project")), settings)
    assert refused.value.code == "ambiguous_ignore_pattern"
    assert ".rayignore" in refused.value.message


def test_code_changed_after_submit_fails_before_ray_sees_it(tmp_path):
    """Ray zips a server path when the job starts, not when it is submitted: a link out
    of the root planted in between fails the job with the policy's message, and no
    submission id is left for Ray to start."""
    root = tmp_path / "code"
    make_code_root(root)
    address = dead_ray()
    settings = Settings(
        storage={"data_dir": tmp_path / "data"}, code={"code_root": str(root)}, cluster={"ray_address": address}
    )
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    service = compose(settings, make_sessionmaker(make_engine(url)), RayBackend(address, timeout_s=2))
    attempts = service.monitor.attempts
    kept, changed = (service.jobs.submit(parse_job_spec(spec(root)))[0].id for _ in range(2))
    assert attempts.prepare(kept) is not None  # unchanged code: the attempt goes ahead

    (root / "app" / "leak").symlink_to(root.parent / "outside.txt")
    assert attempts.prepare(changed) is None
    job = service.reads.get(changed)
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.USER_CODE
    assert job.error.startswith("code_link_outside_root:") and "app/leak" in job.error
