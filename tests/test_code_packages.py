"""Code packages without a cluster: the client's deterministic zip and its excludes, and
the server's upload route against everything a hostile or broken upload can be (a
mismatched hash, a path out of the package, a link, a zip bomb, a body over the cap,
an upload cut off halfway). Each refusal has its code and leaves nothing stored.

The server's Ray address is a port where nothing answers: uploads and job validation
need no cluster, and the jobs submitted stay QUEUED.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from api.client import Client
from api.code_package import TOP, build_package, package_files
from api.errors import CodeTooLarge, InvalidSpec
from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import free_ports
from tests.support.user_code import IGNORE_CASES

MAX_FILES, MAX_BYTES = 30, 256 * 1024


def write_tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text("def train(config):\n    pass\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    for junk in (".git", ".venv/lib", "pkg/__pycache__", "logs"):
        (root / junk).mkdir(parents=True)
        (root / junk / "x.txt").write_text("junk")
    (root / ".gitignore").write_text("logs/\n")
    (root / "pkg" / "notes.tmp").write_text("excluded by the spec")


def test_package_is_deterministic_and_leaves_out_what_it_should(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    write_tree(one)
    write_tree(two)
    os.utime(two / "pkg" / "train.py", (1_000_000, 1_000_000))  # other times, same bytes
    a = build_package(one, ["*.tmp"], max_bytes=MAX_BYTES, max_files=MAX_FILES)
    b = build_package(two, ["*.tmp"], max_bytes=MAX_BYTES, max_files=MAX_FILES)
    try:
        assert a.sha256 == b.sha256 and a.path.read_bytes() == b.path.read_bytes()
        with zipfile.ZipFile(a.path) as zf:
            infos = zf.infolist()
        names = [i.filename for i in infos]
        assert (
            names
            == sorted(names)
            == [f"{TOP}/.gitignore", f"{TOP}/pkg/__init__.py", f"{TOP}/pkg/train.py", f"{TOP}/run.sh"]
        )
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in infos}
        assert modes[f"{TOP}/run.sh"] == 0o755 and modes[f"{TOP}/pkg/train.py"] == 0o644
        assert a.sha256 == hashlib.sha256(a.path.read_bytes()).hexdigest()
    finally:
        a.discard()
        b.discard()


def test_big_data_files_are_left_out_and_caps_name_the_biggest(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "table.csv").write_bytes(b"1,2\n" * 300)
    (tmp_path / "main.py").write_text("x = 1\n")
    files, left_out = package_files(tmp_path, threshold=1000)
    assert [rel for rel, _ in files] == ["main.py"]
    assert left_out == [("data/table.csv", 1200)]
    (tmp_path / "weights.py").write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(CodeTooLarge) as refused:
        build_package(tmp_path, max_bytes=MAX_BYTES, max_files=MAX_FILES)
    assert "RAYDOCK_CODE_MAX_BYTES" in refused.value.message and "weights.py" in refused.value.message


def test_links_to_files_outside_the_directory_are_not_packed(tmp_path):
    """A project holding a link to the user's cloud credentials (by mistake or planted):
    the package never carries the credentials; a link inside the project still packs."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = AKIA-SECRET\n")
    project = home / "project"
    (project / "conf").mkdir(parents=True)
    (project / "main.py").write_text("def train(config):\n    pass\n")
    (project / "conf" / "aws").symlink_to(home / ".aws" / "credentials")
    (project / "entry.py").symlink_to(project / "main.py")
    with pytest.warns(UserWarning, match="conf/aws"):
        package = build_package(project, max_bytes=MAX_BYTES, max_files=MAX_FILES)
    try:
        with zipfile.ZipFile(package.path) as zf:
            names = zf.namelist()
            packed = b"".join(zf.read(n) for n in names)
    finally:
        package.discard()
    assert names == [f"{TOP}/entry.py", f"{TOP}/main.py"]
    assert b"AKIA-SECRET" not in packed


@pytest.fixture(scope="module")
def upload_server(tmp_path_factory):
    dead_ray = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens: jobs stay QUEUED
    base = tmp_path_factory.mktemp("uploads")
    env = {"RAYDOCK_CODE_MAX_FILES": str(MAX_FILES), "RAYDOCK_CODE_MAX_BYTES": str(MAX_BYTES), "RAYDOCK_CODE_ROOT": ""}
    server = ServerProcess(base / "data", dead_ray, extra_env=env, cwd=base).start()
    yield server
    server.stop()


def stored(server: ServerProcess) -> list[str]:
    """Every file of code the server holds, stored or on its way in."""
    places = [server.data_dir / "storage" / "_code", server.data_dir / "code-incoming"]
    return sorted(str(p) for place in places if place.exists() for p in place.rglob("*") if p.is_file())


def zip_of(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return buf.getvalue()


def link_entry() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(f"{TOP}/secrets")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def bomb() -> bytes:
    """One entry that declares 10 bytes and inflates to 10 MiB."""
    data = zip_of([(f"{TOP}/a.py", b"\0" * (10 * 2**20))])
    buf = bytearray(data)
    for sig, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header, central directory
        at = buf.find(sig)
        buf[at + size_at : at + size_at + 4] = (10).to_bytes(4, "little")
    return bytes(buf)


def with_mode(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFREG | mode) << 16
    return info


HOSTILE = [
    (
        "a second name for a file, with a dot step",
        zip_of([(f"{TOP}/main.py", b"a"), (f"{TOP}/./main.py", b"b")]),
        "code_package_unsafe",
    ),
    (
        "a reserved package behind a dot step",
        zip_of([(f"{TOP}/./trainers/__init__.py", b"evil")]),
        "code_package_unsafe",
    ),
    ("an empty step", zip_of([(f"{TOP}//main.py", b"x")]), "code_package_unsafe"),
    ("a setuid file", zip_of([(with_mode(f"{TOP}/run.sh", 0o4755), b"#!/bin/sh\n")]), "code_package_unsafe"),
    ("a world-writable file", zip_of([(with_mode(f"{TOP}/main.py", 0o666), b"x")]), "code_package_unsafe"),
    ("an absolute path", zip_of([("/etc/cron.d/x", b"x")]), "code_package_unsafe"),
    ("a path out of the package", zip_of([(f"{TOP}/../../x.py", b"x")]), "code_package_unsafe"),
    ("a symlink", zip_of([(link_entry(), b"/etc/passwd")]), "code_package_unsafe"),
    ("an entry outside code/", zip_of([("main.py", b"x")]), "code_package_unsafe"),
    ("a zip bomb", bomb(), "code_package_unsafe"),
    ("more files than the cap", zip_of([(f"{TOP}/f{i}.py", b"") for i in range(MAX_FILES + 1)]), "code_too_large"),
    ("more bytes unpacked than the cap", zip_of([(f"{TOP}/z.py", b"\0" * (MAX_BYTES + 1))]), "code_too_large"),
    ("not a zip", b"hello, not a zip", "code_package_invalid"),
]


@pytest.mark.parametrize("what,body,code", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_uploads_are_refused_and_nothing_is_stored(upload_server, what, body, code):
    sha = hashlib.sha256(body).hexdigest()
    r = httpx.put(f"{upload_server.url}/v1/code/{sha}", content=body, timeout=30)
    assert r.status_code in (413, 422), r.text
    assert r.json()["error"]["code"] == code, r.json()
    if code == "code_too_large":
        assert "RAYDOCK_CODE_MAX" in r.json()["error"]["message"]
    assert httpx.head(f"{upload_server.url}/v1/code/{sha}").status_code == 404
    assert stored(upload_server) == []


def test_upload_checks_hash_cap_and_half_bodies(upload_server, tmp_path):
    url = upload_server.url
    body = zip_of([(f"{TOP}/main.py", b"def train(config):\n    pass\n")])
    sha = hashlib.sha256(body).hexdigest()
    wrong = httpx.put(f"{url}/v1/code/{'0' * 64}", content=body)
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "code_hash_mismatch"
    over = httpx.put(f"{url}/v1/code/{sha}", content=b"\0" * (MAX_BYTES + 1))
    assert over.status_code == 413 and "RAYDOCK_CODE_MAX_BYTES" in over.json()["error"]["message"]
    # A client that promises the whole body, sends half and goes away leaves nothing behind.
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = f"PUT /v1/code/{sha} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/zip\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body[: len(body) // 2])
    deadline = time.monotonic() + 10
    while stored(upload_server) and time.monotonic() < deadline:  # the server notices the hang-up
        time.sleep(0.1)
    assert httpx.head(f"{url}/v1/code/{sha}").status_code == 404
    assert stored(upload_server) == []

    first = httpx.put(f"{url}/v1/code/{sha}", content=body)
    again = httpx.put(f"{url}/v1/code/{sha}", content=body)
    assert (first.status_code, again.status_code) == (201, 200), first.text
    info = httpx.get(f"{url}/v1/code/{sha}").json()
    assert (info["files"], info["jobs"]) == (1, 0)
    assert len(stored(upload_server)) == 1


def test_specs_name_packages_the_server_has(upload_server, tmp_path):
    """A code reference the server does not have, an entrypoint not in the package, a
    reserved top-level name, a server path with no code root: each a 422 with its code;
    an SDK submit of a local directory uploads it and the job names the package."""
    http = httpx.Client(base_url=upload_server.url, timeout=30)
    job = {"name": "up", "entrypoint": "pkg.train:train", "scaling": {"num_workers": 1}}
    unknown = http.post("/v1/jobs", json={**job, "code": "sha256:" + "1" * 64})
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "code_package_not_found"
    server_path = http.post("/v1/jobs", json={**job, "working_dir": str(tmp_path)})
    assert server_path.status_code == 422 and "upload" in server_path.json()["error"]["message"]

    write_tree(tmp_path / "proj")
    with Client(upload_server.url) as client:
        missing = {**job, "entrypoint": "pkg.nothere:train", "working_dir": str(tmp_path / "proj")}
        with pytest.raises(InvalidSpec) as refused:
            client.submit(missing)
        (tmp_path / "proj" / "trainers").mkdir()
        (tmp_path / "proj" / "trainers" / "__init__.py").write_text("")
        with pytest.raises(InvalidSpec) as reserved:
            client.submit({**job, "working_dir": "proj"}, base_dir=tmp_path)
        (tmp_path / "proj" / "trainers" / "__init__.py").unlink()
        (tmp_path / "proj" / "trainers").rmdir()
        submitted = client.submit({**job, "working_dir": "proj"}, base_dir=tmp_path)
        upload = client.last_upload
    assert refused.value.code == "entrypoint_not_found"
    assert reserved.value.code == "code_name_reserved" and "trainers" in reserved.value.message
    assert upload is not None and upload.status == 200  # the same bytes as the refused submit's: known already
    assert submitted.info.spec["code"] == upload.ref and submitted.info.spec["working_dir"] is None
    assert http.get(f"/v1/code/{upload.sha256}").json()["jobs"] == 1
    assert http.post(f"/v1/jobs/{submitted.id}/cancel").json()["status"] == "CANCELLED"


def test_cli_refuses_code_over_the_caps_before_sending_it(upload_server, tmp_path):
    project = tmp_path / "big"
    (project / "code").mkdir(parents=True)
    (project / "code" / "main.py").write_text("def train(config):\n    pass\n")
    (project / "code" / "weights.py").write_bytes(b"#" * (MAX_BYTES + 1))  # not a data suffix: it counts
    (project / "job.yaml").write_text("entrypoint: main:train\nworking_dir: code\nscaling: {num_workers: 1}\n")
    before = stored(upload_server)
    env = {**os.environ, "RAYDOCK_URL": upload_server.url, "COLUMNS": "400"}  # wide enough that rich wraps nothing
    run = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", "job.yaml"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "RAYDOCK_CODE_MAX_BYTES" in run.stderr and "weights.py" in run.stderr and "code_too_large" in run.stderr
    assert stored(upload_server) == before


def test_uploads_need_the_api_token(tmp_path):
    """The upload route reads no body before the token is checked: a client without it
    gets 401 and nothing is stored, however large the body it announces."""
    server = ServerProcess(
        tmp_path / "data", f"http://127.0.0.1:{free_ports(1)[0]}", token="t0ken", extra_env={"RAYDOCK_CODE_ROOT": ""}
    ).start()
    try:
        body = zip_of([(f"{TOP}/main.py", b"x = 1\n")])
        sha = hashlib.sha256(body).hexdigest()
        refused = httpx.put(f"{server.url}/v1/code/{sha}", content=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert httpx.head(f"{server.url}/v1/code/{sha}").status_code == 401
        assert stored(server) == []
        with Client(server.url, token="t0ken") as client:
            (tmp_path / "code").mkdir()
            (tmp_path / "code" / "main.py").write_text("x = 1\n")
            assert client.upload_code(tmp_path / "code").status == 201
        assert len(stored(server)) == 1
    finally:
        server.stop()


def test_a_search_over_local_code_uploads_its_base_and_stores_the_package_ref(upload_server, tmp_path):
    """The SDK uploads a search's base.working_dir and names it as base.code: every
    trial runs the uploaded package, and the server pins it for the search."""
    write_tree(tmp_path / "project")
    search = {
        "kind": "tune",
        "base": {"entrypoint": "pkg.train:train", "working_dir": "project", "scaling": {"num_workers": 1}},
        "search_space": {"config.lr": {"type": "loguniform", "low": 0.001, "high": 0.1}},
        "metric": "loss",
        "mode": "min",
    }
    with Client(upload_server.url) as client:
        job = client.submit(search, base_dir=tmp_path)
        base = job.info.spec["base"]
        assert base["working_dir"] is None and base["code"] == client.last_upload.ref


def test_a_stored_package_swapped_for_a_fifo_or_a_link_is_refused_not_waited_on(upload_server, tmp_path):
    """Jobs can write the shared storage: one swaps a stored package for a FIFO (a submit
    naming it would wait forever for a writer) or for a link to a zip of the API host."""
    url = upload_server.url
    job = {"name": "swapped", "entrypoint": "pkg.train:train", "scaling": {"num_workers": 1}}
    host_zip = tmp_path / "host.zip"
    host_zip.write_bytes(zip_of([(f"{TOP}/pkg/train.py", b"def train(config): pass\n")]))
    for swap in ("fifo", "link"):
        body = zip_of([(f"{TOP}/pkg/train.py", f"# {swap}\ndef train(config):\n    pass\n".encode())])
        sha = hashlib.sha256(body).hexdigest()
        assert httpx.put(f"{url}/v1/code/{sha}", content=body).status_code == 201
        stored_zip = upload_server.data_dir / "storage" / "_code" / f"{sha}.zip"
        stored_zip.unlink()
        if swap == "fifo":
            os.mkfifo(stored_zip)
        else:
            stored_zip.symlink_to(host_zip)
        r = httpx.post(f"{url}/v1/jobs", json={**job, "code": f"sha256:{sha}"}, timeout=20)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "code_package_not_found"  # as a rewritten one: upload it again


@pytest.mark.parametrize("case", range(len(IGNORE_CASES)))
def test_the_sdk_packs_what_rays_own_packaging_would_ship(tmp_path, case):
    """One engine: the SDK reads .gitignore and excludes as Ray's packaging does, so an
    uploaded package holds exactly the files Ray would have zipped from the directory."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    ignore_files, excludes, path = IGNORE_CASES[case]
    project = tmp_path / "project"
    for rel in (path, "main.py", "sub/other.py", "data/b2", "keep/z.key", "notes.log"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("x = 1\n")
    for where, text in ignore_files.items():
        (project / where).mkdir(parents=True, exist_ok=True)
        (project / where / ".gitignore").write_text(text)
    shipped: set[str] = set()
    _dir_travel(
        project,
        [_get_excludes(project, excludes)],
        lambda p: shipped.add(p.relative_to(project).as_posix()) if p.is_file() else None,
        include_gitignore=True,
    )
    packed, _ = package_files(project, excludes)
    if not shipped:
        # A bare `*` in the top .gitignore matches Ray's top directory itself ("."), so Ray
        # would zip nothing; the SDK reads it as git does and packs what `!` brings back.
        assert {name for name, _ in packed} and ignore_files.get("", "").startswith("*\n")
        return
    assert {name for name, _ in packed} == shipped
