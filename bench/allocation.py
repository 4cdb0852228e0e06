"""How long a whole allocation cycle takes on a large cluster: snapshot from the database,
plan with the engine, persist the proposals (scheduler.cycle), and the engine alone.

    python -m bench.allocation [--repeat 3] [--seed 1] [--sizes 0.25,0.5,0.75,1]

Cluster: a 3-tier fat tree built by fabric.fattree and imported and registered as
build_fattree does, 8 pods x 16 leaves x 32 hosts x 8 GPUs (4,096 hosts, 32,768 GPUs), all
hosts up in one pool. Half the GPUs are held by running placements of jobs placed at random
(sizes and run times drawn from the ITP cluster04 trace, ../shared/sched/traces/), and
10,000 pending jobs are drawn from the same trace (4 tenants, a few priority levels,
estimated run times). No approval policy: every proposal is approved automatically, so the
cycle writes the most (placements, their GPUs, two audit events per placed job).

`cycle_seconds` is one committed cycle (the lock aside): snapshot + plan + persist (the
after-commit signals have no receivers here: dispatch is not part of the cycle),
`engine_seconds` the best of --repeat runs of the engine on the same snapshot. `scaling`
repeats both at smaller sizes (pods and queue scaled together), each in a fresh database.

Database: unless DATABASE_URL is set, a throw-away SQLite file (WAL, as in production on
SQLite). With a PostgreSQL DATABASE_URL, a throw-away database on that server, dropped at
the end (bench.poll's helpers). Prints one JSON object.
Targets (issue 4; 2 cores): a whole cycle <= 2 s, the engine alone <= 1 s, at full size.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .poll import create_scratch_postgres, drop_scratch_postgres
from .workloads import DataError, fat_tree, half_full, itp_jobs, pending_jobs

FULL = {"pods": 8, "leaves_per_pod": 16, "hosts_per_leaf": 32, "spines_per_pod": 4, "jobs": 10_000}
TARGETS = {"cycle_seconds": 2.0, "engine_seconds": 1.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="engine runs per size; the fastest counts (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sizes", default="0.25,0.5,0.75,1", help="fractions of the full size (default: %(default)s)")
    parser.add_argument("--one-size", type=float, help=argparse.SUPPRESS)  # a child: one size, database prepared
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.one_size is not None:
        return one_size(args)
    try:
        sizes = sorted({float(s) for s in args.sizes.split(",")})
        if not sizes or any(not 0 < s <= 1 or round(FULL["pods"] * s) < 1 for s in sizes):
            raise ValueError
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: fractions between 1/8 and 1, comma-separated")
    try:
        itp_jobs()
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    # Each size in its own process and a fresh database: nothing of one run (caches, memory,
    # table size) slows or speeds up another.
    base_url = os.environ.get("DATABASE_URL")
    scaling = []
    for fraction in sizes:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.dev", DEBUG="0")
        scratch = scratch_pg = None
        if base_url:
            scratch_pg = create_scratch_postgres(base_url)
            if not scratch_pg:
                print("error: bench.allocation needs a throw-away database: no DATABASE_URL (SQLite) or a PostgreSQL "
                      "server where it may create one", file=sys.stderr)
                return 2
            env["DATABASE_URL"] = scratch_pg[1]
        else:
            scratch = tempfile.TemporaryDirectory(prefix="fabricpool-bench-alloc-")
            env["DATABASE_URL"] = f"sqlite:///{Path(scratch.name) / 'bench.sqlite3'}"
        try:
            child = subprocess.run(
                [sys.executable, "-m", "bench.allocation", "--one-size", str(fraction), "--repeat", str(args.repeat),
                 "--seed", str(args.seed)], env=env, capture_output=True, text=True, timeout=900)
        finally:
            if scratch is not None:
                scratch.cleanup()
            if scratch_pg is not None:
                drop_scratch_postgres(*scratch_pg)
        if child.returncode != 0:
            print(f"error: the run at size {fraction} failed:\n{child.stderr[-3000:]}", file=sys.stderr)
            return 1
        scaling.append(json.loads(child.stdout))
    full = scaling[-1]
    report = {
        **{k: full[k] for k in ("hosts", "gpus", "pending_jobs", "running_jobs", "busy_gpus", "placed", "gpus_placed",
                                "pending_reasons", "cycle_seconds", "snapshot_seconds", "plan_seconds",
                                "persist_seconds", "engine_seconds", "snapshot_queries", "database")},
        "targets": TARGETS,
        "within_target": full["cycle_seconds"] <= TARGETS["cycle_seconds"]
        and full["engine_seconds"] <= TARGETS["engine_seconds"],
        "scaling": [{"gpus": s["gpus"], "pending_jobs": s["pending_jobs"], "engine_seconds": s["engine_seconds"],
                     "cycle_seconds": s["cycle_seconds"]} for s in scaling],
    }
    print(json.dumps(report, indent=2))
    return 0


def one_size(args) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    # Dispatch is not part of the cycle, and this database is thrown away: no receiver may
    # enqueue Celery tasks for its placements.
    from scheduler import signals

    for signal in (signals.placements_approved, signals.placements_stop_requested, signals.job_state_changed):
        signal.receivers = []
        signal.sender_receivers_cache = {}
    result = measure(args.one_size, itp_jobs(), args.seed, args.repeat)
    result["database"] = connection.vendor
    print(json.dumps(result))
    return 0


def measure(fraction: float, trace, seed: int, repeat: int) -> dict:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from fabric import fattree
    from fabric.importer import import_topology
    from pool import bulk
    from pool.models import Gpu, Host, Pool
    from pool.services import register_hosts_from_fabric
    from scheduler import cycle, engine, snapshot
    from scheduler.models import Job, Placement, PlacementGpu, Tenant

    pods = max(1, round(FULL["pods"] * fraction))
    leaves, per_leaf = pods * FULL["leaves_per_pod"], FULL["hosts_per_leaf"]
    tree = fattree.build(spines=pods * FULL["spines_per_pod"], leaves=leaves, hosts_per_leaf=per_leaf,
                         gpus_per_host=8, pods=pods if pods > 1 else 0)
    pool = Pool.objects.create(name="bench")
    with transaction.atomic():
        result = import_topology(tree.topology, "bench", source_name="bench.allocation")
        register_hosts_from_fabric(result.fabric, gpus_per_host=8, pool=pool)
        Host.objects.update(state=Host.State.UP)

    # The same cluster as the engine benchmarks see it: host i of fat_tree() is gpu{i+1:04d}.
    model = fat_tree(leaves=leaves, hosts_per_leaf=per_leaf, pods=pods)
    gpu_pk = {(name, index): pk for pk, name, index in Gpu.objects.values_list("id", "host__name", "index")}
    rng = random.Random(seed)
    now = timezone.now()
    running, busy = half_full(model, trace, rng, now=now.timestamp())
    queue = pending_jobs(round(FULL["jobs"] * fraction), trace, rng, now=now.timestamp())
    tenants = {f"team{i}": Tenant.objects.create(name=f"team{i}").pk for i in range(4)}

    with transaction.atomic():
        db_now = bulk.db_datetime(now)
        job_fields = ["tenant", "pool", "gpus", "gpu_models", "min_memory_mib", "fp64", "site", "task_class",
                      "priority", "gang", "whole_hosts", "estimated_runtime_s", "preemptible", "topology_hard",
                      "max_wait_s", "command", "env", "name", "state", "state_changed_at", "created_at",
                      "pending_reason", "pending_message"]
        rows = []
        for r in running:
            rows.append((tenants[r.tenant], pool.pk, len(r.gpu_ids), "[]", 0, "", "", "training", 0, True, True,
                         max(1, int(r.expected_end - now.timestamp())), False, False, 0, '["train"]', "{}", r.job_id,
                         "running", db_now, db_now, "", ""))
        for j in queue:
            created = bulk.db_datetime(datetime.fromtimestamp(j.submit_time, UTC))
            rows.append((tenants[j.tenant], pool.pk, j.gpus, "[]", 0, "", "", "training", j.priority, True, True,
                         max(1, int(j.estimated_runtime or 1)), False, False, 0, '["train"]', "{}", f"q{j.id}",
                         "pending", created, created, "", ""))
        bulk.insert_rows(Job, job_fields, rows, prepared=True)
        job_pk = dict(Job.objects.filter(state="running").values_list("name", "id"))
        bulk.insert_rows(Placement, [
            "job", "state", "hosts", "leaves", "pod_crossings", "health_penalty", "fragmentation_left", "explanation",
            "borrowed", "borrowed_gpus", "partial", "is_override", "proposed_gpus", "proposed_cost", "decided_by_name",
            "reject_reason", "version", "created_at", "started_at", "message"],
            [(job_pk[r.job_id], "running", 0, 0, 0, 0.0, 0, "", False, 0, False, False, "[]", "{}", "policy", "", 1,
              db_now, db_now, "") for r in running], prepared=True)
        placement_pk = dict(Placement.objects.values_list("job_id", "id"))
        bulk.insert_rows(PlacementGpu, ["placement", "gpu", "active"], [
            (placement_pk[job_pk[r.job_id]], gpu_pk[(model.host_names[model.host_of(g)], g % 8)], True)
            for r in running for g in r.gpu_ids])

    # Engine alone, on the snapshot the cycle would take.
    with CaptureQueriesContext(connection) as queries:
        taken = snapshot.take(now)
    best = None
    for _ in range(repeat):
        started = time.perf_counter()
        plan = engine.plan(taken.snapshot)
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)

    # One whole committed cycle.
    started = time.perf_counter()
    outcome = cycle.run_unlocked(now)
    cycle_seconds = time.perf_counter() - started
    if not outcome.ok:
        raise SystemExit(f"the cycle failed: {outcome.error}")
    return {
        "hosts": len(tree.hosts), "gpus": len(gpu_pk), "pending_jobs": len(queue), "running_jobs": len(running),
        "busy_gpus": len(busy), "placed": outcome.auto_approved + outcome.proposed,
        "gpus_placed": PlacementGpu.objects.filter(active=True).count() - len(busy),
        "pending_reasons": outcome.pending_reasons, "engine_placed": len(plan.placed),
        "cycle_seconds": round(cycle_seconds, 3), "snapshot_seconds": round(outcome.snapshot_s, 3),
        "plan_seconds": round(outcome.plan_s, 3), "persist_seconds": round(outcome.persist_s, 3),
        "engine_seconds": round(best, 4), "snapshot_queries": len(queries.captured_queries),
    }


if __name__ == "__main__":
    sys.exit(main())
