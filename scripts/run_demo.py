"""`make demo`: Redis, the database, a demo fat-tree, its pool and tenants and a demo
operator, then the simulated agents of its hosts, the web server, the Celery worker,
Celery beat and a steady stream of jobs in the foreground until Ctrl-C. DEMO_AGENTS_PORT
moves the simulator (default 9500).

Run with the project's virtual environment (the Makefile does). PORT changes the web port
(default 8000); DEMO_PASSWORD sets the demo operator's password (default: one generated
once into var/demo_password); DATABASE_URL and REDIS_URL are honoured as everywhere.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from redis_service import RedisUnavailable, ensure_redis, port_free
from supervisor import Program, Supervisor

ROOT = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("FABRICPOOL_VAR_DIR", ROOT / "var"))
PYTHON = sys.executable
WEB_HOST = "127.0.0.1"

DEMO_USER = "demo"
DEMO_ROLE = "operator"
DEMO_FABRIC = [
    "build_fattree", "--fabric", "demo", "--spines", "4", "--leaves", "8",
    "--hosts-per-leaf", "8", "--gpus-per-host", "8", "--speed", "NDR",
]  # fmt: skip


class SetupError(Exception):
    pass


def programs(port: int, agents_port: int) -> list[Program]:
    """The demo's long-running programs. Add job generators and the like here: the
    supervisor starts, prefixes and stops every entry the same way."""
    return [
        # One process serves a virtual agent for every host of the demo fabric.
        Program("agents", [PYTHON, "-m", "agent", "simulate", "--fabric", "demo", "--bind", WEB_HOST, "--port", str(agents_port)]),
        # daphne's 1 MiB default websocket message limit is below a ~3,000-host pool snapshot.
        Program("web", [PYTHON, "-m", "daphne", "-b", WEB_HOST, "-p", str(port),
                        "--websocket-max-message-size", str(16 * 1024 * 1024), "config.asgi:application"]),
        Program("worker", [PYTHON, "-m", "celery", "-A", "config", "worker", "-l", "info", "--concurrency", "2"],
                restart=True),
        Program(
            "beat",
            [PYTHON, "-m", "celery", "-A", "config", "beat", "-l", "info",
             "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"],
            restart=True,
        ),  # fmt: skip
        # A steady stream of jobs sized like the Microsoft ITP trace; some wait for an operator.
        Program("jobs", [PYTHON, "manage.py", "demo_jobs", "--pool", "demo"]),
    ]


def manage(*args: str, env: dict) -> None:
    print(f"demo: manage.py {' '.join(args)}", flush=True)
    result = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, check=False)
    if result.returncode:
        raise SetupError(f"`manage.py {args[0]}` failed with exit code {result.returncode} (its output is above)")


def demo_password() -> str:
    if os.environ.get("DEMO_PASSWORD"):
        return os.environ["DEMO_PASSWORD"]
    path = VAR_DIR / "demo_password"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(12) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def web_port() -> int:
    raw = os.environ.get("PORT", "8000")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SetupError(f"PORT must be a TCP port number (1-65535), got {raw!r}")
    port = int(raw)
    if not port_free(WEB_HOST, port):
        raise SetupError(f"{WEB_HOST}:{port} is already in use: stop what holds it, or run `PORT={port + 1} make demo`")
    return port


def agents_port() -> int:
    raw = os.environ.get("DEMO_AGENTS_PORT", "9500")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SetupError(f"DEMO_AGENTS_PORT must be a TCP port number (1-65535), got {raw!r}")
    port = int(raw)
    if not port_free(WEB_HOST, port):
        raise SetupError(f"{WEB_HOST}:{port} (simulated agents) is in use: set DEMO_AGENTS_PORT to a free port")
    return port


def accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True


def announce_when_up(supervisor: Supervisor, port: int, password: str) -> None:
    """Print where to log in once the web server accepts connections, so that the line is
    not lost in the start-up logs above it."""
    deadline = time.monotonic() + 60
    while not accepts(WEB_HOST, port):
        if time.monotonic() > deadline:
            supervisor.say("demo", f"the web server does not answer on {WEB_HOST}:{port} after 60 s")
            return
        time.sleep(0.5)
    url = f"http://{WEB_HOST}:{port}/"
    database = os.environ.get("DATABASE_URL") or str(VAR_DIR / "fabricpool.sqlite3")
    for line in (
        "",
        f"FabricPool demo: {url}  (log in at {url}login/)",
        f"  user {DEMO_USER!r}, password {password!r} (role {DEMO_ROLE})",
        f"  database {database}; Redis {supervisor.env['REDIS_URL']}",
        "  Ctrl-C stops everything.",
        "",
    ):
        supervisor.say("demo", line)


def main() -> int:
    try:
        port = web_port()
        sim_port = agents_port()
        with ensure_redis(VAR_DIR, log=lambda m: print(f"demo: {m}", flush=True)) as redis_url:
            env = os.environ | {"REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
            password = demo_password()
            manage("migrate", "--noinput", env=env)
            manage(*DEMO_FABRIC, env=env)
            # The demo's hosts answer at the simulator, one path prefix per host.
            manage("set_agent_urls", "--fabric", "demo", "--template", f"http://{WEB_HOST}:{sim_port}/h/{{host}}", env=env)
            # Its hosts in pool "demo", three tenants with quotas, operator approval above 16 GPUs.
            manage("demo_jobs", "--setup", "--fabric", "demo", "--pool", "demo", env=env)
            manage(
                "add_user", DEMO_USER, "--role", DEMO_ROLE, "--password-env", "FABRICPOOL_DEMO_PASSWORD",
                env=env | {"FABRICPOOL_DEMO_PASSWORD": password},
            )  # fmt: skip
            supervisor = Supervisor(programs(port, sim_port), cwd=ROOT, env=env)
            threading.Thread(target=announce_when_up, args=(supervisor, port, password), daemon=True).start()
            return supervisor.run()
    except (SetupError, RedisUnavailable) as exc:
        print(f"make demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("make demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
