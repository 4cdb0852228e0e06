"""How long importing a large fabric takes: parse + diff import of a synthetic 3-tier fat
tree written as ibnetdiscover text, then an unchanged re-import, then host/GPU registration.

    python -m bench.fabric_import [--leaves 64 --hosts-per-leaf 32 --spines 64 --pods 4 --speed NDR]

Uses config.settings.dev, but never the demo database: unless DATABASE_URL is set it runs
on a throw-away SQLite file (migrated first). With DATABASE_URL it migrates that database,
uses a fabric named bench-<random> and deletes that fabric and its hosts afterwards.
Prints one JSON object. Targets (2 cores, SQLite): first import <= 5 s, re-import <= 1 s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fabric_import", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spines", type=int, default=64)
    parser.add_argument("--leaves", type=int, default=64)
    parser.add_argument("--hosts-per-leaf", type=int, default=32)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--cores", type=int, default=None)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--speed", default="NDR")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the first import and the re-import here")
    args = parser.parse_args(argv)

    tmp = None
    if not os.environ.get("DATABASE_URL"):
        tmp = tempfile.TemporaryDirectory(prefix="fabricpool-bench-")
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(tmp.name) / 'bench.sqlite3'}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from fabric import fattree, ibnetdiscover
    from fabric.importer import import_topology
    from fabric.models import Fabric
    from pool.models import Host
    from pool.services import register_hosts_from_fabric

    try:
        tree = fattree.build(spines=args.spines, leaves=args.leaves, hosts_per_leaf=args.hosts_per_leaf, pods=args.pods,
                             cores=args.cores, gpus_per_host=args.gpus_per_host, speed=args.speed)
    except ValueError as exc:
        parser.error(str(exc))
    call_command("migrate", verbosity=0)
    text = fattree.to_ibnetdiscover(tree.topology).encode()
    name = f"bench-{uuid.uuid4().hex[:8]}"

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()

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

    try:
        first, parse_seconds, first_seconds = timed_import()
        again, reparse_seconds, reimport_seconds = timed_import()
        start = time.perf_counter()
        registration = register_hosts_from_fabric(first.fabric, gpus_per_host=tree.gpus_per_host)
        register_seconds = time.perf_counter() - start
        start = time.perf_counter()
        register_hosts_from_fabric(first.fabric, gpus_per_host=tree.gpus_per_host)
        reregister_seconds = time.perf_counter() - start
        report = {
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
            "database": connection.vendor,
            "targets": {"first_import_seconds": 5.0, "reimport_seconds": 1.0},
            "targets_met": first_seconds <= 5.0 and reimport_seconds <= 1.0,
        }
    finally:
        if tmp is None:  # someone's real database: leave it as it was
            Host.objects.filter(fabric__name=name).delete()
            Fabric.objects.filter(name=name).delete()
        connection.close()
        if tmp is not None:
            tmp.cleanup()
    if profiler:
        profiler.dump_stats(args.profile)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
