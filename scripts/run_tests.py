"""`make test`: the Debian packages the tests need (installed when root, otherwise named),
a Redis that answers, then pytest with the arguments in PYTEST_ARGS. Exits with pytest's
exit code (5 when no test ran)."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import system_packages
from redis_service import RedisUnavailable, ensure_redis

ROOT = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("FABRICPOOL_VAR_DIR", ROOT / "var"))
# What the tests drive for real: Redis (Channels, Celery), the IB tools against ibsim,
# and Chromium for the browser tests.
PACKAGES = ["redis-server", "ibsim-utils", "infiniband-diags", "opensm", "chromium"]


def log(message: str) -> None:
    print(f"make test: {message}", flush=True)


def main() -> int:
    try:
        missing = system_packages.ensure(PACKAGES, log=log)
    except RuntimeError as exc:
        log(str(exc))
        return 1
    if missing:
        log(
            f"missing: {', '.join(missing)}; the tests that need them will skip. "
            f"To run them: {system_packages.how_to_install(missing)}"
        )
    argv = [str(Path(sys.executable).parent / "pytest"), *shlex.split(os.environ.get("PYTEST_ARGS", ""))]
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        try:
            env["REDIS_URL"] = stack.enter_context(ensure_redis(VAR_DIR, log=log))
        except RedisUnavailable as exc:
            log(f"{exc}; the tests that need Redis will fail")
        log(f"REDIS_URL={env.get('REDIS_URL', '(unset)')} DATABASE_URL={env.get('DATABASE_URL', '(unset: SQLite)')}")
        log(shlex.join(argv))
        proc = subprocess.Popen(argv, cwd=ROOT, env=env)
        # Ctrl-C reaches pytest directly (same process group); let it print its summary.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = proc.wait()
    if code == 5:
        log("pytest ran no test (exit code 5)")
    return code


if __name__ == "__main__":
    sys.exit(main())
