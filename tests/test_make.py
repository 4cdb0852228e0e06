"""The machinery behind `make demo` and `make test`: the process supervisor, the Redis
helper and, end to end, the demo itself."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

import redis_service  # noqa: E402


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: only its parent has not collected it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids_in(output: str) -> dict[str, int]:
    """`name | pid 123` lines -> {name: 123}"""
    found = {}
    for line in output.splitlines():
        name, _, text = line.partition(" | ")
        if text.startswith("pid "):
            found[name.strip()] = int(text.split()[1])
    return found


# A child that reports its pid (and that of a grandchild it starts), then waits.
CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    mode = sys.argv[1]
    def on_term(signum, frame):
        print("got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else on_term)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("pid", os.getpid(), "grandchild", grandchild.pid, flush=True)
    if mode.startswith("exit"):
        time.sleep(1)
        sys.exit(int(mode[4:]))
    time.sleep(60)
    """
)


def start_supervisor(modes: dict[str, str], grace: float = 10.0) -> subprocess.Popen:
    programs = ", ".join(
        f"Program({name!r}, [sys.executable, '-c', {CHILD!r}, {mode!r}])" for name, mode in modes.items()
    )
    driver = (
        f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from supervisor import Program, Supervisor\n"
        f"sys.exit(Supervisor([{programs}], grace={grace}).run())\n"
    )
    return subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_pids(proc, names, timeout=20):
    """Read the supervisor's output until every child reported its pid."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if set(pids_in("".join(lines))) >= set(names):
            break
    return lines


def grandchildren(lines):
    return [int(line.split()[-1]) for line in lines if " | pid " in line]


def test_a_dying_program_stops_the_others_and_fails_with_the_reason():
    proc = start_supervisor({"web": "wait", "crashy": "exit3"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "supervisor | failed: crashy exited with code 3" in out
    pids = pids_in(out)
    assert set(pids) == {"web", "crashy"}
    time.sleep(0.2)
    assert not alive(pids["web"])
    assert not any(alive(pid) for pid in grandchildren(out.splitlines()))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_every_program_and_its_children(signum):
    proc = start_supervisor({"web": "wait", "worker": "wait", "beat": "wait"})
    lines = wait_for_pids(proc, ["web", "worker", "beat"])
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=30)
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    for name in ("web", "worker", "beat"):
        assert f"{name:<10} | got SIGTERM" in out  # a clean stop, not a kill
        assert f"supervisor | {name} exited with code 0" in out
    pids = pids_in(out)
    assert not any(alive(pid) for pid in [*pids.values(), *grandchildren(out.splitlines())])


def test_a_program_that_ignores_the_signal_is_killed_after_the_grace_period():
    proc = start_supervisor({"stubborn": "ignore-term", "crashy": "exit1"}, grace=1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "stubborn did not stop; killing it" in out
    assert "supervisor | stubborn was stopped by SIGKILL" in out
    assert not alive(pids_in(out)["stubborn"])


def test_a_program_that_cannot_start_is_reported():
    driver = (
        f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from supervisor import Program, Supervisor\n"
        "sys.exit(Supervisor([Program('web', [sys.executable, '-c', 'import time; time.sleep(60)']),"
        " Program('ghost', ['/nonexistent/ghost'])]).run())\n"
    )
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "failed: cannot start ghost:" in result.stdout
    assert "supervisor | web was stopped by SIGTERM" in result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_redis_answers_only_for_redis():
    with socket.socket() as listener:  # something that accepts but is not Redis
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert not redis_service.answers("127.0.0.1", listener.getsockname()[1], timeout=0.3)
    assert not redis_service.answers("127.0.0.1", free_port(), timeout=0.3)


def test_a_redis_url_where_nothing_answers_is_refused_with_the_url(monkeypatch, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(redis_service.RedisUnavailable, match=f"REDIS_URL={url}: no Redis answers there"):
        with redis_service.ensure_redis(tmp_path):
            pass


@pytest.mark.skipif(not redis_service.shutil.which("redis-server"), reason="redis-server is not installed")
def test_private_redis_starts_under_var_and_stops_afterwards(monkeypatch, tmp_path):
    port = free_port()
    monkeypatch.setattr(redis_service, "PORTS", (port,))
    monkeypatch.delenv("REDIS_URL", raising=False)
    with redis_service.ensure_redis(tmp_path, log=lambda message: None) as url:
        assert url == f"redis://127.0.0.1:{port}/0"
        assert redis_service.answers("127.0.0.1", port)
        pid = int((tmp_path / "redis" / "redis.pid").read_text())
        assert (tmp_path / "redis" / "redis.log").exists()
    assert not redis_service.answers("127.0.0.1", port, timeout=0.3)
    assert not alive(pid)


def redis_url_for_demo_test() -> str:
    """The Redis the tests use, but database 14: the demo's worker and beat must not share
    a Celery queue with anything else that runs meanwhile."""
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    return base.rsplit("/", 1)[0] + "/14"


@pytest.mark.slow
def test_demo_serves_the_login_page_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DEMO_PASSWORD"}}
    env |= {"FABRICPOOL_VAR_DIR": str(tmp_path), "PORT": str(port), "REDIS_URL": redis_url_for_demo_test(),
            "DEMO_AGENTS_PORT": str(free_port())}
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        # Its own session, so that the test can send the "terminal's" Ctrl-C to the group.
        demo = subprocess.Popen(
            [sys.executable, "scripts/run_demo.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        # Ctrl-C once all three are up (before that, a program may die of the signal).
        while not all(s in log.read_text() for s in ("FabricPool demo: ", " ready.", "beat: Starting...")):
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        password = (tmp_path / "demo_password").read_text().strip()
        assert f"user 'demo', password '{password}' (role operator)" in text
        assert f"http://127.0.0.1:{port}/login/" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10) as response:
            assert response.status == 200
            assert b'name="password"' in response.read()
        assert "fabric demo: 12 switches, 64 adapters" in text  # the demo fabric was built
        # A living cluster: the simulated agents answer the poll rounds.
        while "64 ok, 0 errors" not in log.read_text():
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=60)
    text = log.read_text()
    assert demo.returncode == 0, text
    for name in ("agents", "web", "worker", "beat", "jobs"):
        assert f"supervisor | {name} exited with code 0" in text, "\n".join(text.splitlines()[-60:])
    pids = pids_in_started(text)
    assert set(pids) == {"agents", "web", "worker", "beat", "jobs"}
    assert not any(alive(pid) for pid in pids.values())
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2)


def pids_in_started(output: str) -> dict[str, int]:
    """`name | started (pid 123): ...` lines -> {name: 123}"""
    found = {}
    for line in output.splitlines():
        name, _, text = line.partition(" | ")
        if text.startswith("started (pid "):
            found[name.strip()] = int(text.split("pid ")[1].split(")")[0])
    return found


def test_a_restartable_program_is_started_again_and_given_up_on_after_the_limit():
    """The demo's worker and beat are restartable: a crash (kombu can die when Redis goes
    away) restarts them; one that keeps crashing stops everything, with the reason."""
    driver = (
        f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "import supervisor\n"
        "from supervisor import Program, Supervisor\n"
        "supervisor.RESTART_LIMIT = 2\n"
        f"web = Program('web', [sys.executable, '-c', {CHILD!r}, 'wait'])\n"
        f"worker = Program('worker', [sys.executable, '-c', {CHILD!r}, 'exit3'], restart=True)\n"
        "sys.exit(Supervisor([web, worker], grace=5).run())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert out.count("supervisor | worker exited with code 3; starting it again") == 2, out
    assert "worker exited 3 times within 60 s; not restarting it" in out
    assert "supervisor | failed: worker exited with code 3" in out
    assert out.count("worker     | started (pid") == 3
