"""Trace replay benchmark: the whole ITP cluster04 trace and the Alibaba openb trace.

    python -m bench.replay [--speed 1,3] [--cycle 60] [--skip-openb]

ITP: 15,802 jobs (60 days) on a 2,048-GPU fat tree (32 leaves x 8 hosts x 8 GPUs, built by
fabric.fattree) under fabricpool (the real engine, age order), fabricpool_short_first (the
engine with Snapshot.order "short_first"), fifo (first fit) and backfill (EASY, first fit),
all in this run. At the trace's own rate (--speed 1) the cluster averages about
a quarter busy and hardly anything queues, so the replay is repeated with submissions
compressed (--speed 3: three times the offered load) where policies differ.
openb: 8,152 pods on the 1,213-node / 6,212-GPU node list, fabricpool (engine.sharing, FGD
style) against best fit: `unallocated_gpu_share` is the GPU capacity left unallocated once
every pod has arrived (they request 98 % of it).
Goals (issue 6): one policy's replay <= 120 s; fabricpool's average queueing delay >= 30 %
below fifo's and below backfill's at equal or higher utilization. Prints one JSON object;
`goals` says which are met, for fabricpool and (keys ending `_short_first`) for
fabricpool_short_first.
"""
from __future__ import annotations

import argparse
import json
import sys

from scheduler.replay import sim, traces

from .workloads import DataError, shared_file

ITP = "traces/msft_itp_cluster04.csv"
OPENB_PODS = "traces/alibaba_openb_pod_list_default.csv"
OPENB_NODES = "traces/alibaba_openb_node_list_gpu_node.csv"
TARGET_SECONDS = 120.0
TARGET_REDUCTION = 0.30


def itp_run(jobs, cluster, speed: float, cycle: float) -> dict:
    policies = {}
    for policy in sim.POLICIES:
        result = sim.replay(cluster, jobs, policy, cycle_s=cycle, speed=speed)
        s = sim.summary(result, cluster)
        policies[policy] = {k: s[k] for k in ("avg_queue_s", "p95_queue_s", "avg_jct_s", "utilization",
                                              "mean_leaves_multi_leaf", "mean_leaves_lower_bound", "fragmentation",
                                              "preemptions", "cycles", "replay_seconds", "jobs_never_started",
                                              "by_size")}
        print(f"speed {speed}: {policy} done in {s['replay_seconds']} s", file=sys.stderr, flush=True)
    goals = {"replay_seconds_max": max(p["replay_seconds"] for p in policies.values()),
             "replay_within_target": all(p["replay_seconds"] <= TARGET_SECONDS for p in policies.values())}
    # Reductions of each engine variant against each baseline (key suffix: the variant's order).
    for variant, suffix in (("fabricpool", ""), ("fabricpool_short_first", "_short_first")):
        fp = policies[variant]
        for base in ("fifo", "backfill"):
            b = policies[base]
            cut = 1 - fp["avg_queue_s"] / b["avg_queue_s"] if b["avg_queue_s"] else 0.0
            goals[f"queue_reduction_vs_{base}{suffix}"] = round(cut, 4)
            goals[f"met_vs_{base}{suffix}"] = cut >= TARGET_REDUCTION and fp["utilization"] >= b["utilization"] - 1e-4
    return {"speed": speed, "policies": policies, "goals": goals}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", default="1,3", help="comma-separated arrival speed-ups (1,3)")
    parser.add_argument("--cycle", type=float, default=60.0,
                        help="cycle interval, simulated s (60, Slurm's sched_interval)")
    parser.add_argument("--skip-openb", action="store_true")
    args = parser.parse_args(argv)
    try:
        jobs = traces.read_itp(shared_file(ITP))
        speeds = [float(s) for s in args.speed.split(",") if s.strip()]
    except (DataError, traces.TraceError, ValueError) as exc:
        print(f"bench.replay: {exc}", file=sys.stderr)
        return 2
    cluster = sim.fat_tree_cluster(leaves=32, hosts_per_leaf=8, gpus_per_host=8)
    runs = [itp_run(jobs, cluster, speed, args.cycle) for speed in speeds]
    first = runs[0]
    out = {
        "trace": "msft_itp_cluster04",
        "jobs": len(jobs),
        "gpus": cluster.gpus,
        "fabric": cluster.name,
        "cycle_s": args.cycle,
        "queue_depth": sim.QUEUE_DEPTH,
        "policies": first["policies"],
        "goals": first["goals"],
        "speed": first["speed"],
        "runs": runs[1:],
    }
    if not args.skip_openb:
        try:
            pods = traces.read_openb_pods(shared_file(OPENB_PODS))
            nodes = traces.read_openb_nodes(shared_file(OPENB_NODES))
        except (DataError, traces.TraceError) as exc:
            print(f"bench.replay: {exc}", file=sys.stderr)
            return 2
        res = {p: sim.replay_openb(nodes, pods, p) for p in sim.OPENB_POLICIES}
        fp, bf = res["fabricpool"]["unallocated_gpu_share"], res["bestfit"]["unallocated_gpu_share"]
        out["openb"] = {
            "trace": "alibaba_openb_pod_list_default", "pods": len(pods), "gpus": res["bestfit"]["gpus"],
            "unallocated_gpu_share": {p: r["unallocated_gpu_share"] for p, r in res.items()},
            "fewer_unallocated_than_bestfit": round(1 - fp / bf, 4) if bf else 0.0,
            "policies": res,
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
