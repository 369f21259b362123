"""The databases store tests run against: SQLite in a temp dir, and a real PostgreSQL
server this test session starts itself (Debian's ``postgresql`` package: ``initdb`` into
a temp dir, its own port, stopped by its pid at the end).

``database_url`` is parametrized over both, so a test that takes it runs twice. A fresh
PostgreSQL database is made for each test and dropped after it. Each fresh database starts
at the newest schema, a copy of one migrated once per session (a migration's work is most
of a store test's setup otherwise); a test marked ``empty_database`` (a migration's own
test) gets an empty one instead. If PostgreSQL cannot
be started the test FAILS, saying why; set ``RAYDOCK_TEST_NO_POSTGRES=1`` to skip the
PostgreSQL half instead (e.g. on a machine without the package).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from service.cluster.local_cluster import free_ports

OPT_OUT_ENV = "RAYDOCK_TEST_NO_POSTGRES"
PG_USER = "raydock-pg"  # initdb refuses to run as root: the server runs as this user then
HOW_TO_GET_IT = "install it with `apt-get install postgresql` (.ci/run does), or set RAYDOCK_TEST_NO_POSTGRES=1 to skip"


class PostgresUnavailable(RuntimeError):
    pass


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries under /usr/lib/postgresql/*/bin; {HOW_TO_GET_IT}")
    return Path(found[-1]).parent


def _run_as() -> str | None:
    """The user to run PostgreSQL as: ourselves, or (as root) a system user made for it."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
    return PG_USER


class PostgresServer:
    """A throwaway PostgreSQL cluster: trust auth on 127.0.0.1, durability off (tests only)."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.user = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="raydock-pg-"))
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self._migrated: str | None = None  # a database at the newest schema, the template of ``migrated`` ones

    def _as_user(self) -> dict:
        return {"user": self.user, "group": pwd.getpwnam(self.user).pw_gid} if self.user else {}

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        if self.user:
            shutil.chown(self.root, self.user)
        data, log = self.root / "data", self.root / "server.log"
        init = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"],
            capture_output=True,
            text=True,
            cwd=self.root,
            **self._as_user(),
        )
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.root),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        args = [str(self.bin / "postgres"), "-D", str(data)] + [
            a for k, v in settings.items() for a in ("-c", f"{k}={v}")
        ]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True, **self._as_user()
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresUnavailable(f"postgres exited with {self.proc.returncode}: {log.read_text()[-2000:]}")
            try:
                self._admin("SELECT 1")
                return self
            except Exception:  # noqa: BLE001 - not accepting connections yet
                time.sleep(0.1)
        raise PostgresUnavailable(f"postgres did not accept connections within {timeout:g}s: {log.read_text()[-2000:]}")

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True, connect_timeout=5
        ) as conn:
            conn.execute(sql)

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, *, migrated: bool = False) -> str:
        """A new database: empty, or (``migrated``) a copy of one brought to the newest schema once."""
        name = "t" + uuid.uuid4().hex[:12]
        self._admin(f"CREATE DATABASE {name}" + (f" TEMPLATE {self._migrated_template()}" if migrated else ""))
        return name

    def _migrated_template(self) -> str:
        if self._migrated is None:
            from service.db.engine import make_engine

            name = self.create_database()
            make_engine(self.url(name)).dispose()  # no connection left on it: a template must have none
            self._migrated = name
        return self._migrated

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server; a test that needs it fails if it cannot start
    (skips only with RAYDOCK_TEST_NO_POSTGRES=1)."""
    if os.environ.get(OPT_OUT_ENV) == "1":
        pytest.skip(f"PostgreSQL tests skipped: {OPT_OUT_ENV}=1")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail("psycopg is not installed: install the dev extra (`pip install -e '.[dev]'`)", pytrace=False)
    server = None
    try:
        server = PostgresServer()
        server.start()
    except (PostgresUnavailable, OSError, subprocess.CalledProcessError) as exc:
        if server is not None:
            server.stop()
        pytest.fail(f"PostgreSQL could not be started for the store tests: {exc}", pytrace=False)
    yield server
    server.stop()


_sqlite_migrated: dict[Path, Path] = {}  # the session's base temp dir -> a SQLite store at the newest schema


def _migrated_sqlite(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if base not in _sqlite_migrated:
        from service.db.engine import make_engine

        path = tmp_path_factory.mktemp("migrated") / "store.db"
        make_engine(f"sqlite:///{path}").dispose()
        _sqlite_migrated[base] = path
    return _sqlite_migrated[base]


def _fresh_database(request, directory: Path, kind: str, empty: bool):
    if kind == "sqlite":
        path = directory / "store.db"
        if not empty:
            template = _migrated_sqlite(request.getfixturevalue("tmp_path_factory"))
            for suffix in ("", "-wal"):  # the log too, if the last close left one
                if (src := template.with_name(template.name + suffix)).exists():
                    shutil.copy2(src, path.with_name(path.name + suffix))
        yield f"sqlite:///{path}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.create_database(migrated=not empty)
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """A fresh database at the newest schema (``empty_database``: with no schema at all): a
    SQLite file, or a new database on the session's PostgreSQL."""
    empty = request.node.get_closest_marker("empty_database") is not None
    yield from _fresh_database(request, tmp_path, request.param, empty)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_database_url(request, tmp_path_factory) -> str:
    """The same, one per module and database: for a module whose tests share one server on it
    (each test keeping to jobs of its own)."""
    yield from _fresh_database(request, tmp_path_factory.mktemp("store"), request.param, False)
