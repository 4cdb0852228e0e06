"""Make sure a Redis answers before the demo or the tests start.

REDIS_URL set: that Redis must answer. Unset: a Redis answering on 127.0.0.1:6379 (or on
6390, where an earlier private one may still run) is used; otherwise a private
`redis-server` is started under var/redis/ (pid and log there, nothing saved to disk) on
6379, or on 6390 when something that is not Redis holds 6379, and stopped on the way out.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import system_packages

HOST = "127.0.0.1"
PORTS = (6379, 6390)


class RedisUnavailable(Exception):
    pass


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis server replies to PING (a NOAUTH error is a reply too)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(b"PING\r\n")
            reply = conn.recv(64)
    except OSError:
        return False
    return reply[:1] in (b"+", b"-")


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def url_for(port: int) -> str:
    return f"redis://{HOST}:{port}/0"


@contextlib.contextmanager
def ensure_redis(var_dir: Path, *, log=print):
    """Yields the REDIS_URL to give to the processes; raises RedisUnavailable with what to do."""
    url = os.environ.get("REDIS_URL")
    if url:
        parts = urlsplit(url)
        if parts.scheme in ("redis", "rediss") and not answers(parts.hostname or "localhost", parts.port or 6379):
            raise RedisUnavailable(f"REDIS_URL={url}: no Redis answers there (start it, or unset REDIS_URL)")
        yield url
        return
    for port in PORTS:
        if answers(HOST, port):
            yield url_for(port)
            return
    with _private_redis(var_dir, log=log) as port:
        yield url_for(port)


@contextlib.contextmanager
def _private_redis(var_dir: Path, *, log):
    try:
        missing = system_packages.ensure(["redis-server"], log=log)
    except RuntimeError as exc:
        raise RedisUnavailable(f"no Redis answers on {HOST}:6379 and installing redis-server failed: {exc}") from None
    binary = shutil.which("redis-server", path=system_packages.SEARCH_PATH)
    if missing or not binary:
        raise RedisUnavailable(
            f"no Redis answers on {HOST}:6379 and redis-server is not installed: "
            f"install it ({system_packages.how_to_install(['redis-server'])}) or set REDIS_URL"
        )
    port = next((p for p in PORTS if port_free(HOST, p)), None)
    if port is None:
        raise RedisUnavailable(f"ports {PORTS} on {HOST} are taken by something that is not Redis; set REDIS_URL")
    directory = var_dir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    logfile = directory / "redis.log"
    argv = [
        binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
        "--dir", str(directory), "--pidfile", str(directory / "redis.pid"), "--logfile", str(logfile),
    ]  # fmt: skip
    log(f"starting a private Redis on {HOST}:{port} (log {logfile})")
    # Own session: the terminal's Ctrl-C must not stop Redis before the programs using it.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not answers(HOST, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = logfile.read_text(errors="replace").splitlines()[-5:] if logfile.exists() else []
                raise RedisUnavailable(f"redis-server did not start on {HOST}:{port}: " + " / ".join(tail))
            time.sleep(0.1)
        yield port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log(f"private Redis on {HOST}:{port} stopped")
