"""The whole FabricPool stack as real processes, for the reliability suite (tests/reliability)
and the soak benchmark (bench.soak): a private redis-server on a free port, a fresh
PostgreSQL database, a synthetic fat tree with its simulated agents, Celery worker(s) and
beat, and (optionally) the ASGI server. Every process runs in its own session so it can be
killed with its children; everything is torn down by `close()`.

The invariants of ../shared/DESIGN.md are checked from outside, with SQL, by `violations()`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def _admin_url() -> str:
    """Where to create the stack's databases: RELIABILITY_POSTGRES_URL, else the server of a
    PostgreSQL DATABASE_URL (its "postgres" database), else the local default."""
    if os.environ.get("RELIABILITY_POSTGRES_URL"):
        return os.environ["RELIABILITY_POSTGRES_URL"]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        return url.rsplit("/", 1)[0] + "/postgres"
    return "postgresql://postgres@127.0.0.1:5432/postgres"


POSTGRES_ADMIN_URL = _admin_url()
ACTIVE = ("proposed", "approved", "dispatching", "running")


class StackUnavailable(Exception):
    """Something the stack needs (redis-server, PostgreSQL) is not here."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """predicate()'s first truthy value within timeout, else TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


def _admin_connection():
    import psycopg

    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        raise StackUnavailable(f"PostgreSQL at {POSTGRES_ADMIN_URL} does not answer: {exc}") from exc


class Stack:
    def __init__(self, workdir: Path, *, spines: int = 2, leaves: int = 4, hosts_per_leaf: int = 4,
                 gpus_per_host: int = 8, env: dict | None = None, log=None):
        if not shutil.which("redis-server"):
            raise StackUnavailable("redis-server is not installed (Debian: apt-get install redis-server)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fault_dir = self.workdir / "faults"
        self.fault_dir.mkdir(exist_ok=True)
        self.shape = (spines, leaves, hosts_per_leaf, gpus_per_host)
        self.redis_port, self.sim_port, self.web_port = free_port(), free_port(), free_port()
        self.dbname = f"fp_rel_{uuid.uuid4().hex[:10]}"
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.database_url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + self.dbname
        self.procs: dict[str, subprocess.Popen] = {}
        self.log = log or (lambda message: None)
        self.env = os.environ | {
            "DJANGO_SETTINGS_MODULE": "config.settings.dev",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "CELERY_BROKER_URL": self.redis_url,
            "SECRET_KEY": "reliability-" + uuid.uuid4().hex,
            "AGENT_TOKEN_SECRET": "reliability-agents-" + uuid.uuid4().hex,
            "FABRICPOOL_VAR_DIR": str(self.workdir / "var"),
            "FABRICPOOL_FAULT_DIR": str(self.fault_dir),
            "LIVE_KEY_PREFIX": f"rel-{uuid.uuid4().hex[:6]}:",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
            # Faults must heal in seconds, not the production minutes.
            "POLL_INTERVAL": "3", "CYCLE_INTERVAL": "3", "CYCLE_LOCK_TTL": "10",
            "CELERY_VISIBILITY_TIMEOUT": "10", "DISPATCH_STALE_S": "8", "DISPATCH_BACKOFF_S": "0.5",
            "POLL_READ_TIMEOUT": "2", "POLL_CONNECT_TIMEOUT": "1",
        } | (env or {})
        self.env.pop("FABRICPOOL_FAULT_PAUSE", None)
        self._db_created = False

    # -- processes -------------------------------------------------------------------------------

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        logfile = open(self.workdir / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env | (env or {}), stdout=logfile, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        logfile.close()
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """The program and every process it started (its session)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def kill_worker_child(self, name: str = "worker") -> int:
        """SIGKILL the pool process of a prefork worker (what the OOM killer does); its main
        process stays up. Returns the killed pid."""
        children = psutil.Process(self.procs[name].pid).children(recursive=True)
        if not children:
            raise RuntimeError(f"{name} has no pool process")
        children[0].send_signal(signal.SIGKILL)
        return children[0].pid

    def restart_exited(self) -> list[str]:
        """What a process supervisor (systemd Restart=on-failure, `make demo`'s) does for the
        worker and beat: start again the ones that exited by themselves. Returns their names."""
        restarted = []
        for name, proc in list(self.procs.items()):
            if proc.poll() is None or not (name.startswith("worker") or name == "beat"):
                continue
            self.procs.pop(name)
            self.log(f"{name} exited with {proc.returncode}; starting it again")
            self.start_worker(name, concurrency=2) if name.startswith("worker") else self.start_beat()
            restarted.append(name)
        return restarted

    def log_of(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_redis(self) -> None:
        self.start("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(self.workdir)])
        wait_for(lambda: self._redis_answers(), 10, f"redis-server on port {self.redis_port}")

    def _redis_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start_worker(self, name: str = "worker", *, fault: str | None = None, concurrency: int = 1) -> None:
        env = {"FABRICPOOL_FAULT_PAUSE": fault} if fault else {}
        self.start(name, [PYTHON, "-m", "celery", "-A", "config", "worker", "-P", "prefork", "-c", str(concurrency),
                          "-l", "info", "-n", f"{name}@%h", "--without-gossip", "--without-mingle"], env)

    def start_beat(self) -> None:
        self.start("beat", [PYTHON, "-m", "celery", "-A", "config", "beat", "-l", "info", "-s",
                            str(self.workdir / "beat-schedule"),
                            "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"])

    def start_agents(self) -> None:
        self.start("agents", [PYTHON, "-m", "agent", "simulate", "--fabric", "rel", "--bind", "127.0.0.1",
                              "--port", str(self.sim_port)])
        wait_for(lambda: self._http_ok(f"http://127.0.0.1:{self.sim_port}/healthz"), 60, "the agent simulator")

    def start_web(self) -> None:
        self.start("web", [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port), "config.asgi:application"])
        wait_for(lambda: self._http_ok(f"http://127.0.0.1:{self.web_port}/login/"), 60, "the web server")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    # -- set-up ----------------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run([PYTHON, "manage.py", *args, *(["--skip-checks"] if args[0] != "shell" else [])], cwd=ROOT, env=self.env, capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        if result.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def shell(self, code: str, timeout: float = 120) -> str:
        """Run Python with Django set up in a fresh process (what an operator's action does)."""
        return self.manage("shell", "-c", code, timeout=timeout)

    def create_database(self) -> None:
        with _admin_connection() as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        self._db_created = True

    def setup(self) -> None:
        """Redis, database, fabric, pool, agents: what `make demo` sets up, smaller."""
        self.start_redis()
        self.create_database()
        self.manage("migrate", "--noinput")
        spines, leaves, hosts_per_leaf, gpus = self.shape
        self.manage("build_fattree", "--fabric", "rel", "--spines", str(spines), "--leaves", str(leaves),
                    "--hosts-per-leaf", str(hosts_per_leaf), "--gpus-per-host", str(gpus), "--speed", "NDR")
        self.manage("set_agent_urls", "--fabric", "rel", "--template",
                    f"http://127.0.0.1:{self.sim_port}/h/{{host}}")
        # The fabric's hosts in pool "rel" with the demo's tenants and quotas; every proposal
        # is approved by policy unless a test says otherwise.
        self.manage("demo_jobs", "--setup", "--fabric", "rel", "--pool", "rel", "--threshold", "100000")
        self.start_agents()

    def submit(self, count: int, gpus: int, *, tenant: str = "team", runtime_s: int = 3600, name: str = "job") -> None:
        """`count` jobs through the same service the dashboard uses (one process for all)."""
        pool = self.sql("SELECT name FROM pool_pool ORDER BY id LIMIT 1")[0][0]
        self.shell(
            "from scheduler import services\n"
            "from scheduler.models import Tenant\n"
            f"t, _ = Tenant.objects.get_or_create(name={tenant!r})\n"
            f"for i in range({count}):\n"
            f"    services.submit_job(None, tenant=t, pool={pool!r}, gpus={gpus}, name=f'{name}-{{i}}',"
            f" command=['sleep', '{runtime_s}'], estimated_runtime_s={runtime_s})\n")

    def send_task(self, name: str, **options) -> None:
        """Put a task on the broker as beat does."""
        from celery import Celery

        app = Celery(broker=self.redis_url)
        try:
            app.send_task(name, **options)
        finally:
            app.close()

    def agent_report(self, host: str) -> dict:
        from agent.protocol import derive_token

        request = urllib.request.Request(f"http://127.0.0.1:{self.sim_port}/h/{host}/v1/report", headers={
            "Authorization": f"Bearer {derive_token(self.env['AGENT_TOKEN_SECRET'], host)}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    # -- state -----------------------------------------------------------------------------------

    def sql(self, query: str, params=()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def fault_reached(self, point: str) -> bool:
        return (self.fault_dir / point).exists()

    def clear_fault(self, point: str) -> None:
        (self.fault_dir / point).unlink(missing_ok=True)

    def job_states(self) -> dict[str, int]:
        return dict(self.sql("SELECT state, count(*) FROM scheduler_job GROUP BY state"))

    def violations(self) -> list[str]:
        """The invariants, as the database holds them now; [] when all hold."""
        active = "('" + "','".join(ACTIVE) + "')"
        checks = {
            "a GPU in two active placements": f"""
                SELECT pg.gpu_id FROM scheduler_placementgpu pg WHERE pg.active
                GROUP BY pg.gpu_id HAVING count(*) > 1 AND min(pg.share_milli) >= 1000""",
            "GPU shares over a whole GPU": """
                SELECT pg.gpu_id FROM scheduler_placementgpu pg WHERE pg.active
                GROUP BY pg.gpu_id HAVING count(*) > 1 AND sum(pg.share_milli) > 1000""",
            "an active GPU row of an ended placement": f"""
                SELECT pg.id FROM scheduler_placementgpu pg JOIN scheduler_placement p ON p.id = pg.placement_id
                WHERE pg.active AND p.state NOT IN {active}""",
            "an active placement without GPUs": f"""
                SELECT p.id FROM scheduler_placement p WHERE p.state IN {active} AND p.kind = 'place'
                AND NOT EXISTS (SELECT 1 FROM scheduler_placementgpu pg WHERE pg.placement_id = p.id AND pg.active)""",
            "a placed job without exactly one active placement": f"""
                SELECT j.id FROM scheduler_job j WHERE j.state IN {active} AND
                (SELECT count(*) FROM scheduler_placement p WHERE p.job_id = j.id AND p.state IN {active}) <> 1""",
            "a job in two active placements": f"""
                SELECT p.job_id FROM scheduler_placement p WHERE p.state IN {active}
                GROUP BY p.job_id HAVING count(*) > 1""",
            "a half-written allocation cycle": """
                SELECT c.id FROM scheduler_allocationcycle c WHERE c.finished_at IS NULL""",
            "a placement of a cycle that failed": """
                SELECT p.id FROM scheduler_placement p JOIN scheduler_allocationcycle c ON c.id = p.cycle_id
                WHERE c.error <> ''""",
        }
        found = []
        for what, query in checks.items():
            rows = self.sql(query)
            if rows:
                found.append(f"{what}: {[r[0] for r in rows[:10]]}")
        return found

    def rss_mib(self, name: str) -> float:
        """Resident memory of a program and its children, MiB."""
        proc = psutil.Process(self.procs[name].pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total / 2**20

    def summary(self) -> dict:
        return {"jobs": self.job_states(),
                "cycles": self.sql("SELECT count(*) FROM scheduler_allocationcycle")[0][0],
                "rounds": self.sql("SELECT count(*) FROM pool_pollround WHERE finished_at IS NOT NULL")[0][0]}

    # -- tear-down -------------------------------------------------------------------------------

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM if name != "redis" else signal.SIGKILL)
        if self._db_created:
            try:
                with _admin_connection() as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
            except Exception as exc:  # noqa: BLE001 - tear-down must not hide the test's own failure
                self.log(f"could not drop {self.dbname}: {exc}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def dump(stack: Stack) -> str:
    """Everything a failing test should print: the logs' tails and the state."""
    parts = [json.dumps(stack.summary(), default=str)]
    for name in ("worker", "worker2", "beat", "agents", "web", "redis"):
        text = stack.log_of(name)
        if text:
            parts.append(f"--- {name} (tail) ---\n" + text[-3000:])
    return "\n".join(parts)
