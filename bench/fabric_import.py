"""How long importing a large fabric takes: parse + diff import of a synthetic 3-tier fat
tree written as ibnetdiscover text, then an unchanged re-import, then host/GPU registration.

    python -m bench.fabric_import [--leaves 64 --hosts-per-leaf 32 --spines 64 --pods 4 --speed NDR]

Uses config.settings.dev, but never the demo database: unless DATABASE_URL is set it runs
on a throw-away SQLite file (migrated first). With DATABASE_URL it migrates that database
and runs everything in one transaction that is rolled back at the end, so the database is
left as it was (the benchmark's hosts gpu0001... could otherwise take over existing hosts
of the same name); commits are then not part of the times.
Prints one JSON object. Targets (2 cores, SQLite): first import <= 5 s, re-import <= 1 s.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

TARGETS = {"first_import_seconds": 5.0, "reimport_seconds": 1.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fabric_import", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spines", type=int, default=64)
    parser.add_argument("--leaves", type=int, default=64)
    parser.add_argument("--hosts-per-leaf", type=int, default=32)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--cores", type=int, default=None)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--speed", default="NDR")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the two imports here (pstats format)")
    args = parser.parse_args(argv)

    scratch = None
    if not os.environ.get("DATABASE_URL"):
        scratch = tempfile.TemporaryDirectory(prefix="fabricpool-bench-")
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(scratch.name) / 'bench.sqlite3'}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from fabric import fattree

    try:
        tree = fattree.build(spines=args.spines, leaves=args.leaves, hosts_per_leaf=args.hosts_per_leaf, pods=args.pods,
                             cores=args.cores, gpus_per_host=args.gpus_per_host, speed=args.speed)
    except ValueError as exc:
        parser.error(str(exc))
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    try:
        call_command("migrate", verbosity=0)
        # Someone's own database: one transaction, rolled back, leaves it as it was.
        outer = transaction.atomic() if scratch is None else contextlib.nullcontext()
        with outer:
            report = run(tree, profiler)
            if scratch is None:
                transaction.set_rollback(True)
        report["database"] = connection.vendor
        report["rolled_back"] = scratch is None
    finally:
        connection.close()
        if scratch is not None:
            scratch.cleanup()
    if profiler:
        profiler.dump_stats(args.profile)
    print(json.dumps(report, indent=2))
    return 0


def run(tree, profiler) -> dict:
    from fabric import fattree, ibnetdiscover
    from fabric.importer import import_topology
    from pool.services import register_hosts_from_fabric

    text = fattree.to_ibnetdiscover(tree.topology).encode()
    name = f"bench-{uuid.uuid4().hex[:8]}"

    def timed_import():
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        topo = ibnetdiscover.parse(text)
        parsed = time.perf_counter()
        result = import_topology(topo, name, source_name="bench")
        done = time.perf_counter()
        if profiler:
            profiler.disable()
        return result, parsed - start, done - start

    def timed(function, *args, **kwargs):
        start = time.perf_counter()
        return function(*args, **kwargs), time.perf_counter() - start

    first, parse_seconds, first_seconds = timed_import()
    again, reparse_seconds, reimport_seconds = timed_import()
    registration, register_seconds = timed(register_hosts_from_fabric, first.fabric, gpus_per_host=tree.gpus_per_host)
    _, reregister_seconds = timed(register_hosts_from_fabric, first.fabric, gpus_per_host=tree.gpus_per_host)
    return {
        "fabric": tree.describe(),
        "hosts": len(tree.hosts),
        "gpus": registration.gpus_created,
        "switches": first.switches,
        "adapters": first.adapters,
        "links": first.links,
        "lines": text.count(b"\n"),
        "bytes": len(text),
        "parse_seconds": round(parse_seconds, 3),
        "first_import_seconds": round(first_seconds, 3),
        "reimport_seconds": round(reimport_seconds, 3),
        "reimport_parse_seconds": round(reparse_seconds, 3),
        "reimport_changed": again.changed,
        "register_hosts_seconds": round(register_seconds, 3),
        "reregister_hosts_seconds": round(reregister_seconds, 3),
        "targets": TARGETS,
        "targets_met": first_seconds <= TARGETS["first_import_seconds"] and reimport_seconds <= TARGETS["reimport_seconds"],
    }


if __name__ == "__main__":
    sys.exit(main())
