"""manage.py replay TRACE --fabric NAME [--policy ...] [--speed N] [--out DIR]

Replays a job trace through the scheduler in simulated time (scheduler.replay) and writes
report.json and report.html into --out. --fabric names a fabric in the database (its hosts
and leaf switches), or a synthetic fat tree `fattree:LEAVESxHOSTS_PER_LEAFxGPUS_PER_HOST`
(e.g. fattree:32x8x8, 2,048 GPUs). An Alibaba openb pod list is replayed on its node list
(--nodes, default: alibaba_openb_node_list_gpu_node.csv next to the trace).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from scheduler.replay import report, sim, traces

FATTREE = re.compile(r"^fattree:(\d+)x(\d+)x(\d+)$")
NODE_LIST = "alibaba_openb_node_list_gpu_node.csv"


def cluster_from_db(name: str, gpus_per_host: int | None) -> sim.Cluster:
    from fabric.models import Fabric
    from pool.models import Host
    from scheduler.snapshot import _fabric

    fabric = Fabric.objects.filter(name=name).first()
    if fabric is None:
        known = ", ".join(Fabric.objects.order_by("name").values_list("name", flat=True)[:20]) or "none"
        raise CommandError(f"no fabric named {name!r} (fabrics: {known}; or use fattree:LEAVESxHOSTSxGPUS)")
    hosts = list(Host.objects.filter(fabric=fabric).order_by("name").values_list("id", "name"))
    if not hosts:
        raise CommandError(f"fabric {name!r} has no hosts")
    host_leaves, leaves, pods, _ = _fabric([h for h, _ in hosts], [fabric.id])
    counts = Counter(n for n in Host.objects.filter(fabric=fabric).annotate(n=Count("gpus")).values_list("n", flat=True)
                     if n)
    gph = gpus_per_host or (counts.most_common(1)[0][0] if counts else 8)
    leaf_name = {leaf.id: leaf.name for leaf in leaves}
    leaf_pod = {leaf.id: leaf.pod for leaf in leaves}
    pod_index = {p.id: i for i, p in enumerate(pods)}
    groups: dict[tuple, int] = {}
    names, host_leaf, group_names, group_pods = [], [], [], []
    for hid, hname in hosts:
        key = tuple(host_leaves.get(hid, ())) or ("host", hid)
        if key not in groups:
            groups[key] = len(group_names)
            group_names.append("+".join(leaf_name.get(l, str(l)) for l in key) if key[0] != "host" else hname)
            group_pods.append(pod_index.get(leaf_pod.get(key[0]), 0))
        names.append(hname)
        host_leaf.append(groups[key])
    return sim.Cluster(host_names=names, host_leaf=host_leaf, leaf_names=group_names, leaf_pod=group_pods,
                       gpus_per_host=gph, name=f"fabric {name} ({len(names)} hosts x {gph} GPUs, "
                                                 f"{len(group_names)} leaves)")


class Command(BaseCommand):
    help = "Replay a job trace (Microsoft ITP or Alibaba openb) in simulated time and write a report."

    def add_arguments(self, parser):
        parser.add_argument("trace", help="CSV: Microsoft ITP job_id,submission_time,duration,num_gpu or an "
                                          "Alibaba openb pod list")
        parser.add_argument("--fabric", required=True,
                            help="fabric name in the database, or fattree:LEAVESxHOSTS_PER_LEAFxGPUS_PER_HOST")
        parser.add_argument("--policy", action="append", choices=sim.POLICIES + ("bestfit",),
                            help="repeat for several (default: fabricpool, fabricpool_short_first, fifo and "
                                 "backfill; openb: fabricpool and bestfit)")
        parser.add_argument("--speed", type=float, default=1.0,
                            help="divide submission times by N: N times the offered load (default 1)")
        parser.add_argument("--cycle", type=float, default=10.0, help="cycle interval, simulated seconds (10)")
        parser.add_argument("--depth", type=int, default=sim.QUEUE_DEPTH,
                            help=f"jobs a cycle considers, oldest first ({sim.QUEUE_DEPTH}; 0: all)")
        parser.add_argument("--gpus-per-host", type=int, default=None,
                            help="for a database fabric whose hosts report no GPUs (default 8)")
        parser.add_argument("--nodes", help=f"openb node list (default: {NODE_LIST} next to the trace)")
        parser.add_argument("--out", default="var/replay", help="report folder (var/replay)")

    def handle(self, *args, **opts):
        path = Path(opts["trace"])
        try:
            kind = traces.kind(path)
            if kind == "openb":
                self._openb(path, opts)
            elif kind == "itp":
                self._itp(path, opts)
            else:
                raise CommandError(f"{path} is a node list, not a job trace")
        except (traces.TraceError, sim.ReplayError, ValueError) as exc:
            raise CommandError(str(exc)) from None

    def _cluster(self, spec: str, gph) -> sim.Cluster:
        m = FATTREE.match(spec)
        if m:
            leaves, hosts, gpus = map(int, m.groups())
            return sim.fat_tree_cluster(leaves=leaves, hosts_per_leaf=hosts, gpus_per_host=gpus)
        return cluster_from_db(spec, gph)

    def _itp(self, path: Path, opts) -> None:
        jobs = traces.read_itp(path)  # all rows checked before anything runs
        policies = opts["policy"] or list(sim.POLICIES)
        if "bestfit" in policies:
            raise CommandError("bestfit is the openb baseline; for ITP use fabricpool, fifo or backfill")
        cluster = self._cluster(opts["fabric"], opts["gpus_per_host"])
        results = []
        for policy in policies:
            self.stdout.write(f"replaying {len(jobs)} jobs under {policy} on {cluster.name} ...")
            results.append(sim.replay(cluster, jobs, policy, cycle_s=opts["cycle"], speed=opts["speed"],
                                      depth=opts["depth"] or None))
        data = report.build(str(path), cluster, results, {"speed": opts["speed"], "cycle_s": opts["cycle"],
                                                           "depth": opts["depth"] or None})
        paths = report.write(opts["out"], data, results)
        for name, p in data["policies"].items():
            self.stdout.write(f"{name}: avg queue {p['avg_queue_s']} s, p95 {p['p95_queue_s']} s, avg JCT "
                              f"{p['avg_jct_s']} s, utilization {p['utilization']:.1%}, leaves per multi-host job "
                              f"{p['mean_leaves_multi_leaf']} (bound {p['mean_leaves_lower_bound']}), "
                              f"{p['replay_seconds']} s")
        self._finish(paths)

    def _openb(self, path: Path, opts) -> None:
        nodes_path = Path(opts["nodes"]) if opts["nodes"] else path.parent / NODE_LIST
        pods = traces.read_openb_pods(path)
        nodes = traces.read_openb_nodes(nodes_path)
        policies = opts["policy"] or list(sim.OPENB_POLICIES)
        out = {}
        for policy in policies:
            self.stdout.write(f"placing {len(pods)} pods under {policy} on {len(nodes)} nodes ...")
            out[policy] = sim.replay_openb(nodes, pods, policy)
            self.stdout.write(f"{policy}: {out[policy]['unallocated_gpu_share']:.2%} of GPU capacity unallocated, "
                              f"{out[policy]['failed']} pods refused")
        gpus = sum(n.gpus for n in nodes)
        data = {"trace": str(path), "jobs": len(pods), "gpus": gpus, "fabric": f"openb node list {nodes_path}",
                "settings": {}, "policies": {}}
        paths = report.write(opts["out"], data, [], openb={"policies": out,
                                                           "unallocated_gpu_share": {k: v["unallocated_gpu_share"]
                                                                                     for k, v in out.items()}})
        self._finish(paths)

    def _finish(self, paths) -> None:
        if not report.kaleido_available():
            self.stdout.write("PNG/SVG plots skipped: kaleido is not installed; the HTML report has the plots.")
        for p in paths:
            self.stdout.write(f"wrote {p}")
