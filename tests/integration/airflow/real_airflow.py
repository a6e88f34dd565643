"""A real Airflow deployment for tests: the api-server, scheduler, dag-processor and triggerer of
``.venv`` as separate processes with the LocalExecutor, in a fresh AIRFLOW_HOME, on a PostgreSQL
database of its own (:func:`postgres_database`: the database Airflow is deployed on; SQLite is for
development only), and a small client of its REST API (``/api/v2``) authenticated with a JWT from
the simple auth manager.

:meth:`Airflow.stop` stops the components' process groups, then whatever is left of their
descendants and of the processes started with the deployment's AIRFLOW_HOME in their environment
(task processes, stage processes, ranks).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import psycopg2
from processes import alive
from psycopg2 import sql

from pipelines.launch.ports import free_ports

ROOT = Path(__file__).resolve().parents[3]
AIRFLOW = Path(sys.executable).with_name("airflow")
TRAINER_PY = ROOT / ".venv-trainer" / "bin" / "python"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
HEALTH = ("metadatabase", "scheduler", "dag_processor", "triggerer")  # /api/v2/monitor/health
USER, PASSWORD = "admin", "admin-" + secrets.token_hex(4)
NOTES: list[str] = []  # timings the tests note, printed when the session's deployment stops


def free_port() -> int:
    """A port for a component that binds it only once started: from below the ephemeral range,
    where no outgoing connection takes it meanwhile (pipelines.launch.ports)."""
    return free_ports(1)[0]


def quote(value: str) -> str:
    """A run id (``manual__2026-01-01T00:00:00+00:00``) as one path segment."""
    return urllib.parse.quote(value, safe="")


class ApiError(AssertionError):
    def __init__(self, status: int, body, method: str, path: str):
        super().__init__(f"{method} {path}: HTTP {status}: {json.dumps(body)[:3000]}")
        self.status, self.body = status, body


class Api:
    """``/api/v2`` and ``/auth`` of one api-server, as ``(status, JSON body)``."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.token: str | None = None

    def call(self, method: str, path: str, body=None, *, ok=(200, 201, 204), headers=None, timeout=60):
        """The JSON answer; raises :class:`ApiError` unless the status is in ``ok``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode(errors="replace")
        if ok and status not in ok:
            raise ApiError(status, answer, method, path)
        return answer

    def login(self, user: str, password: str) -> None:
        self.token = self.call("POST", "/auth/token", {"username": user, "password": password})["access_token"]

    def get(self, path: str, **kw):
        return self.call("GET", "/api/v2" + path, **kw)

    def post(self, path: str, body, **kw):
        return self.call("POST", "/api/v2" + path, body, **kw)

    def patch(self, path: str, body, **kw):
        return self.call("PATCH", "/api/v2" + path, body, **kw)


MACHINE_PORT = 5432  # the machine's own server, if one answers on 127.0.0.1 (trust, user postgres)


class NoPostgres(RuntimeError):
    """Neither the machine's PostgreSQL nor a private server can be had."""


def connect(port: int, dbname: str = "postgres"):
    """A connection to 127.0.0.1:``port`` as ``postgres`` without a password, in autocommit mode
    (CREATE and DROP DATABASE run outside a transaction)."""
    conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname=dbname, connect_timeout=5)
    conn.autocommit = True
    return conn


def server_binaries() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl, postgres): pg_ctl's on PATH,
    else the newest of Debian's /usr/lib/postgresql/<major>/bin, which the `postgresql` package
    does not put on PATH."""
    found = [Path(p).resolve().parent for p in filter(None, [shutil.which("pg_ctl")])]
    found += sorted((p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl") if p.parts[-3].isdigit()),
                    key=lambda b: -int(b.parent.name))
    return next((b for b in found if all((b / n).is_file() for n in ("initdb", "pg_ctl", "postgres"))), None)


class PrivateServer:
    """A throw-away PostgreSQL cluster from the system's binaries: initdb into a temporary folder,
    then pg_ctl start on a free port of 127.0.0.1 with trust authentication and without durability
    (a crash loses nothing a test needs).  As root the programs run as the ``postgres`` system
    user (``nobody`` without one): initdb refuses to run as root."""

    def __init__(self, bindir: Path):
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="hetero-postgres-"))  # not under pytest's 0700 tmp
        self.port = free_port()
        self.as_user: dict = {}
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                user = pwd.getpwnam("nobody")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def run(self, program: str, *args: str) -> None:
        done = subprocess.run([str(self.bin / program), *args], cwd=self.dir, capture_output=True, text=True,
                              timeout=300, **self.as_user)
        if done.returncode:
            log = self.dir / "server.log"
            raise RuntimeError(f"{program} {' '.join(args)}: exit {done.returncode}\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}{log.read_text()[-2000:] if log.exists() else ''}")

    def start(self) -> None:
        data = str(self.dir / "data")
        self.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self.run("pg_ctl", "-D", data, "-l", str(self.dir / "server.log"), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        if (self.dir / "data" / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def postgres_database(prefix: str = "hetero_airflow"):
    """``(SQLAlchemy URL, where)`` of a new, empty database, dropped at the end: on the machine's
    own server when one answers on 127.0.0.1:5432, else on a :class:`PrivateServer`, stopped and
    removed at the end.  Raises :class:`NoPostgres` when neither can be had."""
    try:
        connect(MACHINE_PORT).close()
        server, port, where = None, MACHINE_PORT, "the machine's server on 127.0.0.1:5432"
    except psycopg2.OperationalError as e:
        bindir = server_binaries()
        if bindir is None:
            raise NoPostgres(
                f"no PostgreSQL answers on 127.0.0.1:5432 as user postgres without a password ({str(e).strip()}) "
                "and no server programs (initdb, pg_ctl) are installed; `make setup` installs Debian's "
                "postgresql package") from e
        server = PrivateServer(bindir)
        port, where = server.port, f"a private server from {bindir} on 127.0.0.1:{server.port}"
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        if server:
            server.start()
        with contextlib.closing(connect(port)) as conn, conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{name}", where
    finally:
        if server:
            server.stop()
        else:
            with contextlib.closing(connect(port)) as conn, conn.cursor() as cur:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# The schedule: every day of February, and the deployment's dataset Asset.  With catchup off, the
# scheduler creates exactly one timed run when the DAG is unpaused (the last whole interval,
# 2026-02-27) and no other until 2027, while backfills get the days of February they ask for.
SCHEDULE = "0 0 * 2 *"
DATASET_ASSET = "x-hetero://tests/shapes"


def generate(out: Path, days: list[str], rows_per_day: int = 400) -> Path:
    """The sample dataset: one partition a day from ``days[0]``."""
    gen = subprocess.run(
        [str(TRAINER_PY), "-m", "pipelines", "generate-data", "--out", str(out), "--rows-per-day", str(rows_per_day),
         "--days", str(len(days)), "--start", days[0]],
        capture_output=True, text=True, timeout=300, cwd=str(ROOT),
    )
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [f"dt={d}" for d in days]
    return out


def deployment_env(home: Path, port: int, database: str, job_defaults: Path | None = None) -> dict[str, str]:
    """The environment of every component: ``test_dag_e2e``'s plus what a running deployment needs,
    the metadata database ``database`` (a SQLAlchemy URL) first, and the deployment's job defaults
    file ``job_defaults`` (``HETERO_JOB_DEFAULTS``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "HETERO_"))}
    base = f"http://127.0.0.1:{port}"
    # the log servers' ports: distinct from each other and the api-server's, none of them bound yet
    worker_log, trigger_log = [p for p in free_ports(3) if p != port][:2]
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "HETERO_TRAINER_PYTHON": str(TRAINER_PY),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database,  # the async URL follows (asyncpg)
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",  # tasks of two runs, or two mapped tasks, at once; two cores
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "180",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # The DAG files do not change during a session: parsing them again every 30 s (the default)
        # only takes CPU from the runs under test.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log),
        # A retry waits 5 s at most, not the DAG's 30 s and more (retry_delay, exponential back-off).
        "AIRFLOW__CORE__MAX_TASK_RETRY_DELAY": "5",
        "HETERO_TRAIN_SCHEDULE": SCHEDULE,
        "HETERO_DATASET_ASSET": DATASET_ASSET,
    })
    if job_defaults is not None:
        env["HETERO_JOB_DEFAULTS"] = str(job_defaults)
    return env


class Airflow:
    """The four components of one deployment; :meth:`start`, then :attr:`api`, then :meth:`stop`."""

    def __init__(self, home: Path, database: str, job_defaults: Path | None = None):
        self.home = home
        self.port = free_port()
        self.env = deployment_env(home, self.port, database, job_defaults)
        self.api = Api(f"http://127.0.0.1:{self.port}")
        self.procs: dict[str, subprocess.Popen] = {}
        self.seen: dict[int, psutil.Process] = {}

    def start(self, timeout: float = 600) -> None:
        (self.home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
        migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=self.env, capture_output=True, text=True,
                                 timeout=timeout, cwd=str(ROOT))
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        for name in COMPONENTS:
            args = [str(AIRFLOW), name] + (["--host", "127.0.0.1", "--port", str(self.port)] if name == "api-server" else [])
            with open(self.home / f"{name}.log", "wb") as log:  # the child keeps its own copy
                self.procs[name] = subprocess.Popen(args, env=self.env, cwd=str(ROOT), stdin=subprocess.DEVNULL,
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait(self.healthy, timeout, "the api-server to answer /api/v2/monitor/health")
        self.api.login(USER, PASSWORD)

    def healthy(self) -> bool:
        self.check_alive()
        try:
            health = self.api.call("GET", "/api/v2/monitor/health", timeout=10)
        except (OSError, ApiError):
            return False
        return all((health.get(c) or {}).get("status") == "healthy" for c in HEALTH)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"airflow {name} exited with {proc.returncode}:\n{self.log_tail(name)}"

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def wait(self, ready, timeout: float, what, every: float = 2.0):
        """``ready()``'s first true value within ``timeout`` seconds; fails naming ``what``: a
        string, or a function called at the timeout, so that what it says (a run's task states)
        is what held then, not what held when the wait began."""
        deadline = time.monotonic() + timeout
        while True:
            value = ready()
            if value:
                return value
            if time.monotonic() > deadline:
                said = what() if callable(what) else what
                logs = "\n".join(f"--- {n}:\n{self.log_tail(n, 2000)}" for n in self.procs)
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}\n{logs}")
            time.sleep(every)

    def processes(self) -> list[int]:
        """Live processes of this deployment: the components and their descendants, and anything
        started with its AIRFLOW_HOME (a stage or a rank whose task process died is nobody's
        child).  Both, because a process that sets its title, as Airflow's do, overwrites what
        /proc shows of its environment.  Each process seen is remembered until it ends."""
        for proc in self.procs.values():
            try:
                root = psutil.Process(proc.pid)
                self.seen.update((p.pid, p) for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                pass
        for pid in processes_with_env(AIRFLOW_HOME=str(self.home)):
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(pid, psutil.Process(pid))
        return sorted(pid for pid, p in self.seen.items() if _running(p))

    def stop(self, grace: float = 30) -> list[int]:
        """SIGTERM every component's process group, then SIGKILL what is left of them and of
        everything else of the deployment (:meth:`processes`); returns the pids that needed SIGKILL."""
        self.processes()  # the whole tree, while it is whole
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        killed = []
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
                proc.wait(timeout=30)
        settle = time.monotonic() + 5  # the parent-death signal stops stages and ranks by themselves
        while self.processes() and time.monotonic() < settle:
            time.sleep(0.2)
        deadline = time.monotonic() + grace
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:  # a task process, a stage or a rank in a session of its own
                with contextlib.suppress(psutil.Error):
                    self.seen[pid].kill()
                killed.append(pid)
            time.sleep(0.5)
        return sorted(set(killed))


def _running(p: psutil.Process) -> bool:
    """Still the same process (not a reused pid) and not a zombie."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with; empty when it is gone or not ours."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def cmdline(pid: int) -> str:
    """The command line as ``ps`` shows it (a process title set with setproctitle included)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_with_env(**match: str) -> list[int]:
    """Pids of live processes (not this one) whose environment has every ``NAME=value`` of ``match``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = environ(int(name))
        if env and all(env.get(k) == v for k, v in match.items()) and alive(int(name)):
            found.append(int(name))
    return sorted(found)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


