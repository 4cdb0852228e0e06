"""How fast a poll round is: N simulated agents (agent/simulate.py, in its own process),
polled in full rounds through the same chunk path the Celery task runs (pool.tasks.poll_hosts:
concurrent fetch of a chunk, then one transaction of writes), then one round polling the
agents one after another for comparison.

    python -m bench.poll --agents 4096 [--rounds 30] [--gpus-per-host 8]

Chunks run one after another in this process by default (--workers 1), which is what one
Celery worker process does; --workers 2 runs two chunks at a time in threads, like two
worker processes sharing the machine (SQLite only: each thread has its own connection).

The sequential round uses the same code per agent with one request in flight at a time
(one keep-alive connection), so the ratio is what concurrency buys, not connection setup.

Uses config.settings.dev, never the demo database: unless DATABASE_URL is set it runs on a
throw-away SQLite file. With a PostgreSQL DATABASE_URL it creates a throw-away database on
that server (dropped at the end), so chunks commit as they do in production; where it may
not create databases, everything runs in one transaction rolled back at the end (chunks
are then savepoints, --workers is 1, and rows updated again and again inside one open
transaction cannot be cleaned up as they go: slower than production). Prints one JSON object.
Targets (2 cores, SQLite, 4,096 agents x 8 GPUs): a round within the 10 s interval
(>= 410 agents/s, >= 3,300 GPU samples/s) and memory flat over the rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TARGETS = {"round_seconds": 10.0, "agents_per_s": 410.0, "gpu_samples_per_s": 3300.0, "rss_growth_mb": 50.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.poll", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=None, help="agents per chunk (default: POLL_CHUNK_SIZE)")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight per chunk (default: POLL_CONCURRENCY)")
    parser.add_argument("--workers", type=int, default=1, help="chunks at a time (threads; default: %(default)s)")
    parser.add_argument("--no-sequential", action="store_true", help="skip the one-after-another round")
    parser.add_argument("--agent-latency-ms", type=float, default=0.0,
                        help="every agent answers this much later (the simulator's slow fault), like agents "
                             "across a real network; 0: loopback, where only CPU counts (default: %(default)s)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the rounds (pstats format)")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.rounds < 1 or not 0 <= args.gpus_per_host <= 64 or args.workers < 1:
        parser.error("--agents and --rounds must be >= 1, --gpus-per-host 0..64, --workers >= 1")

    scratch = scratch_pg = None
    if not os.environ.get("DATABASE_URL"):
        scratch = tempfile.TemporaryDirectory(prefix="fabricpool-bench-")
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(scratch.name) / 'bench.sqlite3'}"
    else:
        scratch_pg = create_scratch_postgres(os.environ["DATABASE_URL"])
        if scratch_pg:
            os.environ["DATABASE_URL"] = scratch_pg[1]
        elif args.workers > 1:
            parser.error("--workers > 1 needs a throw-away database (this DATABASE_URL runs in one transaction)")
    throwaway = scratch is not None or scratch_pg is not None
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    os.environ["DEBUG"] = "0"  # no query log growing over the rounds
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, transaction

    if args.chunk_size:
        settings.POLL_CHUNK_SIZE = args.chunk_size
    if args.concurrency:
        settings.POLL_CONCURRENCY = args.concurrency
    workdir = tempfile.TemporaryDirectory(prefix="fabricpool-bench-sim-")
    simulator = None
    try:
        call_command("migrate", verbosity=0)
        outer = transaction.atomic() if not throwaway else contextlib.nullcontext()
        with outer:
            hosts = build_cluster(args.agents, args.gpus_per_host)
            simulator, base = start_simulator(hosts, Path(workdir.name))
            if args.agent_latency_ms > 0:
                set_latency(base, args.agent_latency_ms / 1000)
            report = run(args, base)
            report["agent_latency_ms"] = args.agent_latency_ms
            if not throwaway:
                transaction.set_rollback(True)
        report["database"] = connection.vendor
        report["rolled_back"] = not throwaway
    finally:
        if simulator is not None:
            stop(simulator)
        connection.close()
        workdir.cleanup()
        if scratch is not None:
            scratch.cleanup()
        if scratch_pg is not None:
            drop_scratch_postgres(*scratch_pg)
    print(json.dumps(report, indent=2))
    return 0


def create_scratch_postgres(url: str):
    """(admin URL, scratch URL, name) of a new empty database on the server of a PostgreSQL
    URL, or None (not PostgreSQL, or no right to create databases)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        return None
    import psycopg

    name = f"fabricpool_pollbench_{uuid.uuid4().hex[:8]}"
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        print(f"bench.poll: cannot create a scratch database ({exc}); running in a rolled-back transaction", file=sys.stderr)
        return None
    return admin, urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, "")), name


def drop_scratch_postgres(admin: str, url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def build_cluster(agents: int, gpus_per_host: int) -> list[dict]:
    """A 2-tier fat tree with `agents` hosts, imported and registered as build_fattree does.
    Returns the simulator's hosts file entries (same GPUs, same adapter GUIDs)."""
    from fabric import fattree
    from fabric.importer import import_topology
    from pool.services import register_hosts_from_fabric

    per_leaf = next(n for n in (32, 16, 8, 4, 2, 1) if agents % n == 0)
    leaves = agents // per_leaf
    if leaves > 255:  # a spine has at most 255 ports
        raise SystemExit(f"--agents {agents}: too many leaves for a 2-tier tree; use a multiple of 32 up to 8160")
    tree = fattree.build(spines=8, leaves=leaves, hosts_per_leaf=per_leaf, gpus_per_host=gpus_per_host)
    name = f"bench-poll-{uuid.uuid4().hex[:8]}"
    result = import_topology(tree.topology, name, source_name="bench.poll")
    register_hosts_from_fabric(result.fabric, gpus_per_host=gpus_per_host)
    return [
        {"name": h.name, "gpus": gpus_per_host,
         "hcas": [{"device": d, "node_guid": f"0x{g:016x}"} for d, g in zip(h.devices, h.adapter_guids)]}
        for h in tree.hosts
    ]


def start_simulator(hosts: list[dict], workdir: Path):
    """`python -m agent simulate` on a free port with the server's token secret."""
    from django.db.models import Value
    from django.db.models.functions import Concat

    from pool.models import Host
    from pool.tokens import agent_secret

    hosts_file, secret_file = workdir / "hosts.json", workdir / "secret"
    hosts_file.write_text(json.dumps(hosts))
    secret_file.write_text(agent_secret())
    secret_file.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--hosts-file", str(hosts_file), "--token-secret-file", str(secret_file),
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    base, lines, deadline = None, [], time.monotonic() + 60
    while base is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"agent URLs: (http://\S+?)/h/\{host\}", line)
        if match:
            base = match.group(1)
    if base is None:
        stop(proc)
        raise SystemExit("the simulator did not start:\n" + "".join(lines[-20:]))
    Host.objects.filter(name__in=[h["name"] for h in hosts]).update(agent_url=Concat(Value(base + "/h/"), "name"))
    return proc, base


def set_latency(base: str, seconds: float) -> None:
    import urllib.request

    from agent.protocol import derive_token
    from agent.simulate import CONTROL_TOKEN_NAME
    from pool.tokens import agent_secret

    request = urllib.request.Request(
        f"{base}/control/faults", method="POST",
        data=json.dumps({"host": "*", "fault": "slow", "params": {"delay_s": seconds}}).encode(),
        headers={"Authorization": f"Bearer {derive_token(agent_secret(), CONTROL_TOKEN_NAME)}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def stop(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run(args, base: str) -> dict:
    from django.conf import settings
    from django.db import connection, reset_queries

    from pool import ingest, poller, tasks
    from pool.models import Host

    ids = list(Host.objects.filter(agent_url__startswith=base).order_by("id").values_list("id", flat=True))
    size = int(settings.POLL_CHUNK_SIZE)
    chunks = [ids[i:i + size] for i in range(0, len(ids), size)]
    limits = tasks.limits_from_settings()
    deadline = max(float(settings.POLL_INTERVAL) * 0.8, limits.request_timeout)
    timings = {"fetch": 0.0, "ingest": 0.0}

    def chunk(host_ids, chunk_limits=limits):
        started = time.perf_counter()
        results = poller.fetch_sync(tasks.targets_for(host_ids), chunk_limits, deadline=deadline)
        fetched = time.perf_counter()
        stats = ingest.apply_results(results)
        timings["fetch"] += fetched - started
        timings["ingest"] += time.perf_counter() - fetched
        if args.workers > 1:
            connection.close()  # this thread's connection; the pool thread may be reused, reconnecting is cheap
        return stats

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    pool = ThreadPoolExecutor(max_workers=args.workers) if args.workers > 1 else None
    rounds, rss = [], []
    totals = {"ok": 0, "errors": 0, "gpu_samples": 0}
    try:
        for _ in range(args.rounds):
            if profiler:
                profiler.enable()
            started = time.perf_counter()
            stats = list(pool.map(chunk, chunks)) if pool else [chunk(c) for c in chunks]
            rounds.append(time.perf_counter() - started)
            if profiler:
                profiler.disable()
            for s in stats:
                totals["ok"] += s.hosts_ok
                totals["errors"] += s.hosts_error
                totals["gpu_samples"] += s.gpu_samples
            reset_queries()
            rss.append(rss_mb())
    finally:
        if pool:
            pool.shutdown()
    if profiler:
        profiler.dump_stats(args.profile)
    fetch_s, ingest_s = timings["fetch"] / len(rounds), timings["ingest"] / len(rounds)

    sequential = None
    if not args.no_sequential:
        one_at_a_time = poller.Limits(connect_timeout=limits.connect_timeout, read_timeout=limits.read_timeout,
                                      concurrency=1, max_bytes=limits.max_bytes)
        started = time.perf_counter()
        for c in chunks:
            chunk(c, one_at_a_time)
        sequential = time.perf_counter() - started

    steady = rounds[1:] or rounds  # the first round also adopts every GPU (inventory writes)
    round_s = statistics.median(steady)
    samples_per_round = totals["gpu_samples"] / len(rounds)
    report = {
        "agents": len(ids),
        "gpus_per_host": args.gpus_per_host,
        "rounds": len(rounds),
        "chunk_size": size,
        "chunks": len(chunks),
        "concurrency": limits.concurrency,
        "workers": args.workers,
        "round_seconds": round(round_s, 3),
        "first_round_seconds": round(rounds[0], 3),
        "max_round_seconds": round(max(rounds), 3),
        # time in each phase, summed over chunks (with --workers > 1 they overlap)
        "fetch_seconds_per_round": round(fetch_s, 3),
        "ingest_seconds_per_round": round(ingest_s, 3),
        "agents_per_s": round(len(ids) / round_s, 1),
        "gpu_samples_per_s": round(samples_per_round / round_s, 1),
        "hosts_ok": totals["ok"],
        "hosts_error": totals["errors"],
        "sequential_round_seconds": round(sequential, 3) if sequential else None,
        "sequential_agents_per_s": round(len(ids) / sequential, 1) if sequential else None,
        "speedup_vs_sequential": round(sequential / round_s, 2) if sequential else None,
        "rss_mb_first_round": round(rss[0], 1),
        "rss_mb_last_round": round(rss[-1], 1),
        "rss_mb_max": round(max(rss), 1),
        "targets": TARGETS,
    }
    report["targets_met"] = (
        round_s <= TARGETS["round_seconds"] and report["agents_per_s"] >= TARGETS["agents_per_s"]
        and report["gpu_samples_per_s"] >= TARGETS["gpu_samples_per_s"] * args.gpus_per_host / 8
        and rss[-1] - rss[0] <= TARGETS["rss_growth_mb"] and totals["errors"] == 0
    )
    return report


if __name__ == "__main__":
    sys.exit(main())
