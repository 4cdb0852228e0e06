"""How long the placement engine alone takes for one cycle on a large fabric.

    python -m bench.allocation_engine [--repeat 3] [--seed 1]

Fabric: 3-tier, 8 pods x 16 leaves x 32 hosts x 8 GPUs (4,096 hosts, 32,768 GPUs), half
the GPUs busy with running jobs placed at random (sizes and run times drawn from the ITP
cluster04 trace, ../shared/sched/traces/), and 10,000 queued jobs drawn from the same trace
(4 tenants, a few priority levels, estimated run times, no quotas). `engine_seconds` is the
best of --repeat runs of scheduler.engine.plan on the snapshot (building the snapshot's
dataclasses is not counted; everything the engine derives from them is). `scaling` repeats
it at 1/4, 1/2, 3/4 and the full size, scaling the fabric (pods) and the queue together.
Prints one JSON object. Target (issue 4): <= 1 s at full size on a 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

from scheduler.engine import plan

from .workloads import DataError, fat_tree, half_full, itp_jobs, pending_jobs

FULL = {"pods": 8, "leaves_per_pod": 16, "hosts_per_leaf": 32, "jobs": 10_000}
TARGET_SECONDS = 1.0


def measure(fraction: float, trace, seed: int, repeat: int) -> dict:
    pods = max(1, round(FULL["pods"] * fraction))
    cluster = fat_tree(leaves=pods * FULL["leaves_per_pod"], hosts_per_leaf=FULL["hosts_per_leaf"], pods=pods)
    rng = random.Random(seed)
    running, busy = half_full(cluster, trace, rng)
    queue = pending_jobs(round(FULL["jobs"] * fraction), trace, rng)
    snapshot = cluster.snapshot(busy=busy, running=running, queue=queue)
    best, result = None, None
    for _ in range(repeat):
        started = time.perf_counter()
        result = plan(snapshot)
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    return {"hosts": cluster.hosts, "gpus": cluster.gpus, "pending_jobs": len(queue), "running_jobs": len(running),
            "busy_gpus": len(busy), "placed": len(result.placed),
            "gpus_placed": sum(len(d.gpu_ids) for d in result.placed),
            "pending_reasons": result.pending_reasons(), "engine_seconds": round(best, 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocation_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest counts (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        trace = itp_jobs()
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scaling = [measure(f, trace, args.seed, args.repeat) for f in (0.25, 0.5, 0.75, 1.0)]
    full = scaling[-1]
    print(json.dumps({
        "hosts": full["hosts"], "gpus": full["gpus"], "pending_jobs": full["pending_jobs"],
        "running_jobs": full["running_jobs"], "placed": full["placed"], "gpus_placed": full["gpus_placed"],
        "pending_reasons": full["pending_reasons"], "engine_seconds": full["engine_seconds"],
        "target_seconds": TARGET_SECONDS, "within_target": full["engine_seconds"] <= TARGET_SECONDS,
        "scaling": [{"gpus": s["gpus"], "pending_jobs": s["pending_jobs"], "engine_seconds": s["engine_seconds"]}
                    for s in scaling],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
