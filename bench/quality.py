"""Placement quality: the engine ("fabricpool") against first-fit and a Slurm-like tree
placement ("slurm_tree") on the same fabric and the same job sequence, plus the engine
against an exact solver (scipy's MILP) on small fragmented cases.

    python -m bench.quality [--jobmix FILE.csv --topology topology.conf] [--load 0.9] [--window 0]
                            [--cases 200] [--seed 1]

Every policy follows the same rules: a job of up to 8 GPUs takes one host, a larger one
ceil(N/8) wholly free hosts; the queue is walked in order and every job that fits starts
(no backfill reservations: the runs give the engine no run times, so all three see the
same greedy queue; reservations are covered by the unit tests).

With --jobmix (the slurm-peer protocol, ../shared/sched/slurm-peer/README.md): every job is
queued (priority, then submit order) and the policy fills the cluster in one pass; then
twice 30 % of the running jobs stop (the lowest sha1(f"{seed}:{round}:{job_id}")) and the
policy refills from the queue.
Without: a replay of the first 3,000 jobs of the ITP cluster04 trace (sizes, run times and
arrival order; arrivals compressed to an offered load of 90 %, --load) on a 3-tier fabric of
2 pods x 4 leaves x 16 hosts x 8 GPUs, a scheduling pass every 600 s of trace time. --window K
replays the (K + 1)-th 3,000 jobs instead (K = 0-4): one window's fragmentation figures move by
a GPU or two with any change of placement, and which policy leads changes from window to
window, so compare policies over all five before reading anything into a difference that size.

Policies
  fabricpool  scheduler.engine.plan on a snapshot of the cluster (the real engine).
  first_fit   lowest-numbered host with room; for larger jobs the lowest-numbered whole hosts.
  slurm_tree  Slurm topology/tree as select/cons_tres _eval_nodes_topo does it (22.05): the
              lowest switch whose subtree holds the job, then leaf by leaf the tightest leaf
              that holds the rest, else the largest; nodes in order inside a leaf (the first
              node with room for small jobs, in the leaf with the fewest such nodes).

Measures (per policy)
  placed, gpus_allocated         jobs started and GPUs they got, over the whole run
  after_fill                     (slurm-peer) jobs and GPUs running after the fill, and how long
                                 the policy took (fabricpool: snapshot + engine)
  mean_leaves_multi_leaf         mean leaf switches per multi-host job (N > 8: the jobs whose
                                 placement can span leaves)
  single_leaf_share              of multi-host jobs for which one leaf had room when they were
                                 placed, the share that got one leaf
  mean_excess_over_lower_bound   leaves used minus the fewest possible at that moment
  unusable_for_8gpu              FGD's fragmentation measure: free GPUs on hosts with fewer
                                 than 8 free (they cannot serve an 8-GPU job). slurm-peer: the
                                 mean over the states after each churn and after each refill
                                 (`unusable_for_8gpu_points`); replay: the mean over passes,
                                 and `unusable_for_8gpu_while_8gpu_jobs_wait` over the passes
                                 that left a job of 8 or more GPUs waiting
  minimal_leaves_share_after_churn, mean_excess_leaves_after_churn
                                 multi-host jobs started after jobs have ended (refills;
                                 replay: after the first departure) against ceil(N / GPUs per
                                 leaf), as the slurm-peer README measures Slurm
Exact: random fragmented fabrics (1-3 pods) with one multi-host job whose optimum spans
several leaves; the optimum minimises leaves, then pods (scipy.optimize.milp). Reported:
mean leaves used / mean optimal leaves, the worst single case, the share of cases with the
fewest pods too, and the same ratios for the two baselines.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass

from scheduler.engine import Job, plan

from .workloads import Cluster, DataError, fat_tree, itp_jobs, read_jobmix, read_topology_conf

HOST_GPUS = 8


@dataclass(frozen=True)
class QJob:
    id: str
    gpus: int
    priority: int
    order: int


class State:
    """Which GPUs are free, per host (lowest indices are taken first)."""

    def __init__(self, cluster: Cluster):
        self.c = cluster
        self.free = [list(range(cluster.gpus_per_host)) for _ in range(cluster.hosts)]
        self.leaf_hosts = [[] for _ in cluster.leaf_names]
        for h, l in enumerate(cluster.host_leaf):
            self.leaf_hosts[l].append(h)

    def take(self, gpu_ids) -> None:
        for i in gpu_ids:
            self.free[self.c.host_of(i)].remove(i % self.c.gpus_per_host)

    def give(self, gpu_ids) -> None:
        for i in gpu_ids:
            h = self.c.host_of(i)
            self.free[h].append(i % self.c.gpus_per_host)
            self.free[h].sort()

    def gpus_on(self, h: int, n: int) -> list[int]:
        return [self.c.gpu_id(h, i) for i in self.free[h][:n]]

    def whole(self, h: int) -> bool:
        return len(self.free[h]) == self.c.gpus_per_host

    def busy(self) -> set[int]:
        g = self.c.gpus_per_host
        return {self.c.gpu_id(h, i) for h in range(self.c.hosts) for i in set(range(g)) - set(self.free[h])}

    def leaf_whole_hosts(self) -> list[int]:
        return [sum(1 for h in hosts if self.whole(h)) for hosts in self.leaf_hosts]

    def fewest_leaves(self, n: int) -> int | None:
        need = math.ceil(n / self.c.gpus_per_host)
        counts = sorted(self.leaf_whole_hosts(), reverse=True)
        total = 0
        for k, c in enumerate(counts, 1):
            total += c
            if total >= need:
                return k
        return None

    def unusable_for_8gpu(self) -> int:
        return sum(len(f) for f in self.free if len(f) < HOST_GPUS)


# -- policies --------------------------------------------------------------------------------

def first_fit(state: State, job: QJob) -> list[int] | None:
    c = state.c
    if job.gpus <= c.gpus_per_host:
        for h in range(c.hosts):
            if len(state.free[h]) >= job.gpus:
                return state.gpus_on(h, job.gpus)
        return None
    need = math.ceil(job.gpus / c.gpus_per_host)
    hosts = [h for h in range(c.hosts) if state.whole(h)][:need]
    return _whole_hosts_gpus(state, hosts, job.gpus) if len(hosts) == need else None


def slurm_tree(state: State, job: QJob) -> list[int] | None:
    c = state.c
    if job.gpus <= c.gpus_per_host:
        fits = [[h for h in hosts if len(state.free[h]) >= job.gpus] for hosts in state.leaf_hosts]
        leaves = [l for l, hs in enumerate(fits) if hs]
        if not leaves:
            return None
        leaf = min(leaves, key=lambda l: (len(fits[l]), l))  # the tightest leaf (fewest usable nodes)
        return state.gpus_on(fits[leaf][0], job.gpus)  # its first node in order
    need = math.ceil(job.gpus / c.gpus_per_host)
    avail = [[h for h in hosts if state.whole(h)] for hosts in state.leaf_hosts]
    # The lowest switch whose subtree holds the job: a leaf, else a pod, else the root.
    leaves = [l for l in range(len(avail)) if len(avail[l]) >= need]
    if leaves:
        leaf = min(leaves, key=lambda l: (len(avail[l]), l))
        return _whole_hosts_gpus(state, avail[leaf][:need], job.gpus)
    pods: dict[int, list[int]] = {}
    for l, p in enumerate(c.leaf_pod):
        pods.setdefault(p, []).append(l)
    holding = [p for p, ls in pods.items() if sum(len(avail[l]) for l in ls) >= need]
    if holding:
        pod = min(holding, key=lambda p: (sum(len(avail[l]) for l in pods[p]), p))
        candidates = pods[pod]
    elif sum(map(len, avail)) >= need:
        candidates = list(range(len(avail)))
    else:
        return None
    hosts, rem = [], need
    left = {l: len(avail[l]) for l in candidates if avail[l]}
    while rem > 0:
        fitting = [l for l in left if left[l] >= rem]
        leaf = min(fitting, key=lambda l: (left[l], l)) if fitting else max(left, key=lambda l: (left[l], -l))
        take = min(rem, left.pop(leaf))
        hosts += avail[leaf][:take]
        rem -= take
    return _whole_hosts_gpus(state, hosts, job.gpus)


def _whole_hosts_gpus(state: State, hosts: list[int], n: int) -> list[int]:
    out = []
    for h in hosts:
        out += state.gpus_on(h, min(state.c.gpus_per_host, n - len(out)))
    return out


def run_one_at_a_time(place):
    def schedule(state: State, queue: list[QJob]) -> list[tuple[QJob, list[int]]]:
        placed = []
        for job in queue:
            gpus = place(state, job)
            if gpus is not None:
                state.take(gpus)
                placed.append((job, gpus))
        return placed
    return schedule


def engine_schedule(state: State, queue: list[QJob]) -> list[tuple[QJob, list[int]]]:
    jobs = [Job(id=j.id, tenant="t", pool="default", gpus=j.gpus, priority=j.priority, submit_time=j.order)
            for j in queue]
    result = plan(state.c.snapshot(busy=state.busy(), queue=jobs))
    by_id = {j.id: j for j in queue}
    placed = []
    for d in result.decisions:  # in queue order, as the engine placed them
        if d.placed:
            state.take(d.gpu_ids)
            placed.append((by_id[d.job_id], list(d.gpu_ids)))
    return placed


POLICIES = {"fabricpool": engine_schedule, "first_fit": run_one_at_a_time(first_fit),
            "slurm_tree": run_one_at_a_time(slurm_tree)}


# -- the runs ----------------------------------------------------------------------------------

class Recorder:
    """Runs one scheduling pass and remembers, for every job placed, the leaves it got and
    the fewest leaves any placement could have used at that moment."""

    def __init__(self, cluster: Cluster, policy: str):
        self.cluster = cluster
        self.schedule = POLICIES[policy]
        self.state = State(cluster)
        self.records: list[tuple[str, QJob, int, int]] = []  # (phase, job, leaves, fewest possible)
        self.seconds = 0.0

    def run(self, queue: list[QJob], phase: str) -> list[tuple[QJob, list[int]]]:
        c = self.cluster
        before = State(c)
        before.free = [list(f) for f in self.state.free]
        started = time.perf_counter()
        placed = self.schedule(self.state, queue)
        self.seconds += time.perf_counter() - started
        for job, gpus in placed:  # replayed in order: each job met the state its elders left
            bound = before.fewest_leaves(job.gpus) if job.gpus > c.gpus_per_host else 1
            before.take(gpus)
            self.records.append((phase, job, len({c.host_leaf[c.host_of(i)] for i in gpus}), bound))
        return placed

    def summary(self, unusable: list[int], churned=lambda phase: phase != "fill") -> dict:
        c = self.cluster
        leaf_gpus = max(len(hs) for hs in self.state.leaf_hosts) * c.gpus_per_host
        multi = [r for r in self.records if r[1].gpus > c.gpus_per_host]
        fit_one = [r for r in multi if r[3] == 1]
        churn = [r for r in multi if churned(r[0])]
        return {
            "placed": len(self.records),
            "gpus_allocated": sum(r[1].gpus for r in self.records),
            "multi_host_jobs": len(multi),
            "mean_leaves_multi_leaf": _mean(r[2] for r in multi),
            "single_leaf_share": _mean(r[2] == 1 for r in fit_one),
            "mean_excess_over_lower_bound": _mean(r[2] - r[3] for r in multi),
            "unusable_for_8gpu": _mean(unusable),
            "minimal_leaves_share_after_churn": _mean(r[2] == math.ceil(r[1].gpus / leaf_gpus) for r in churn),
            "mean_excess_leaves_after_churn": _mean(r[2] - math.ceil(r[1].gpus / leaf_gpus) for r in churn),
            "scheduler_seconds": round(self.seconds, 3),
        }


def victims(running: dict, seed: int, round_: int) -> list[str]:
    key = lambda j: hashlib.sha1(f"{seed}:{round_}:{j}".encode(), usedforsecurity=False).hexdigest()  # noqa: E731
    return sorted(running, key=key)[:round(0.3 * len(running))]


def run_protocol(cluster: Cluster, jobs: list[QJob], policy: str, seed: int = 1) -> dict:
    """The slurm-peer protocol: fill, then twice stop 30 % (sha1 rule) and refill."""
    rec = Recorder(cluster, policy)
    pending = sorted(jobs, key=lambda j: (-j.priority, j.order, j.id))
    running: dict[str, list[int]] = {}
    unusable = []

    def fill(phase):
        nonlocal pending
        placed = rec.run(pending, phase)
        running.update((job.id, gpus) for job, gpus in placed)
        done = {job.id for job, _ in placed}
        pending = [j for j in pending if j.id not in done]

    fill("fill")
    after_fill = {"jobs_running": len(running), "gpus_busy": sum(map(len, running.values())),
                  "seconds": round(rec.seconds, 4), "jobs_per_second": round(len(running) / max(rec.seconds, 1e-9))}
    for round_ in (1, 2):
        for j in victims(running, seed, round_):
            rec.state.give(running.pop(j))
        unusable.append(rec.state.unusable_for_8gpu())
        fill(f"refill{round_}")
        unusable.append(rec.state.unusable_for_8gpu())
    return {**rec.summary(unusable), "after_fill": after_fill, "unusable_for_8gpu_points": unusable}


@dataclass(frozen=True)
class ReplayJob(QJob):
    submit: float = 0.0
    duration: float = 0.0


def replay_jobs(count: int, cluster: Cluster, load: float, window: int = 0) -> tuple[list[ReplayJob], float]:
    """ITP jobs `count` x window onwards (`count` of them) in submission order, arrivals
    compressed so that the offered load is `load` x the cluster's GPUs (run times unchanged)."""
    everything = itp_jobs()
    trace = everything[count * window:count * (window + 1)]
    if len(trace) < count:
        raise DataError(f"the ITP trace has {len(everything)} jobs: no window {window} of {count} "
                        f"(windows 0-{len(everything) // count - 1})")
    t0 = trace[0].submit
    span = trace[-1].submit - t0
    offered = sum(t.duration * t.gpus for t in trace) / span
    factor = load * cluster.gpus / offered
    jobs = [ReplayJob(f"j{i:05d}", t.gpus, 0, i, (t.submit - t0) / factor, t.duration) for i, t in enumerate(trace)]
    return jobs, factor


def run_replay(cluster: Cluster, jobs: list[ReplayJob], policy: str, cycle_s: float = 600.0) -> dict:
    """Arrivals and departures from the trace; the policy runs every `cycle_s` on the queue
    (oldest first; every job that fits starts). Fragmentation is sampled after each cycle."""
    rec = Recorder(cluster, policy)
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.order))
    ends: list[tuple[float, str]] = []
    running: dict[str, list[int]] = {}
    queue: list[ReplayJob] = []
    unusable, busy, waits, stranded = [], [], [], []
    t, a = 0.0, 0
    first_departure = None
    while a < len(arrivals) or queue:
        ends.sort()
        while ends and ends[0][0] <= t:
            end, jid = ends.pop(0)
            rec.state.give(running.pop(jid))
            first_departure = first_departure if first_departure is not None else end
        while a < len(arrivals) and arrivals[a].submit <= t:
            queue.append(arrivals[a])
            a += 1
        phase = "steady" if first_departure is not None else "fill"
        for job, gpus in rec.run(queue, phase):
            running[job.id] = gpus
            ends.append((t + job.duration, job.id))
            waits.append(t - job.submit)
        placed = set(running)
        queue = [j for j in queue if j.id not in placed]
        if any(j.gpus >= HOST_GPUS for j in queue):
            stranded.append(rec.state.unusable_for_8gpu())
        unusable.append(rec.state.unusable_for_8gpu())
        busy.append(sum(cluster.gpus_per_host - len(f) for f in rec.state.free))
        t += cycle_s
    return {**rec.summary(unusable, churned=lambda phase: phase == "steady"),
            "utilisation": round(sum(busy) / len(busy) / cluster.gpus, 4),
            "mean_wait_s": _mean(waits), "cycles": len(busy),
            "unusable_for_8gpu_while_8gpu_jobs_wait": _mean(stranded), "cycles_with_8gpu_jobs_waiting": len(stranded)}


def _mean(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None


# -- exact comparison ------------------------------------------------------------------------

def exact_cases(count: int, seed: int) -> dict:
    """Random fragmented fabrics, one whole-host job each whose optimum spans leaves."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise DataError("the exact comparison needs scipy: pip install scipy") from None
    rng = random.Random(seed)
    used = {"fabricpool": [], "first_fit": [], "slurm_tree": []}
    optimum, pods_match = [], []
    while len(optimum) < count:
        pods = rng.randint(1, 3)
        cluster = fat_tree(pods * rng.randint(2, 4), rng.randint(2, 6), pods=pods)
        state = State(cluster)
        for h in range(cluster.hosts):
            r = rng.random()
            busy = 8 if r < 0.45 else rng.randint(1, 7) if r < 0.6 else 0
            state.take([cluster.gpu_id(h, i) for i in range(busy)])
        whole = [h for h in range(cluster.hosts) if state.whole(h)]
        if len(whole) < 2:
            continue
        n = 8 * rng.randint(2, len(whole))
        if state.fewest_leaves(n) in (None, 1):
            continue
        # MILP: x_h (host used), y_l (leaf used), z_p (pod used); min 1000*sum(y) + sum(z).
        L, P = len(cluster.leaf_names), len(cluster.pod_names)
        nv = len(whole) + L + P
        cost = np.zeros(nv)
        cost[len(whole):len(whole) + L] = 1000
        cost[len(whole) + L:] = 1
        rows, lo, hi = [], [], []
        row = np.zeros(nv)
        row[:len(whole)] = 8
        rows.append(row), lo.append(n), hi.append(np.inf)
        for k, h in enumerate(whole):
            row = np.zeros(nv)
            row[k], row[len(whole) + cluster.host_leaf[h]] = 1, -1
            rows.append(row), lo.append(-np.inf), hi.append(0)
        for l in range(L):
            row = np.zeros(nv)
            row[len(whole) + l], row[len(whole) + L + cluster.leaf_pod[l]] = 1, -1
            rows.append(row), lo.append(-np.inf), hi.append(0)
        res = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(nv),
                   bounds=Bounds(0, 1))
        if not res.success:
            raise RuntimeError(f"MILP failed: {res.message}")
        opt_leaves = int(round(res.x[len(whole):len(whole) + L].sum()))
        opt_pods = int(round(res.x[len(whole) + L:].sum()))
        optimum.append(opt_leaves)
        job = QJob("x", n, 0, 0)
        snap_busy = state.busy()
        d = plan(cluster.snapshot(busy=snap_busy, queue=[Job(id="x", tenant="t", pool="default", gpus=n)])).decisions[0]
        used["fabricpool"].append(d.cost.leaves)
        pods_match.append(d.cost.pod_crossings + 1 == opt_pods)
        for name, place in (("first_fit", first_fit), ("slurm_tree", slurm_tree)):
            gpus = place(state, job)
            used[name].append(len({cluster.host_leaf[cluster.host_of(i)] for i in gpus}))

    def ratios(values):
        return {"mean_ratio_to_optimum": round(sum(values) / sum(optimum), 4),
                "max_ratio_to_optimum": round(max(v / o for v, o in zip(values, optimum)), 4)}

    return {"cases": len(optimum), "mean_optimal_leaves": _mean(optimum), **ratios(used["fabricpool"]),
            "pods_optimal_share": _mean(pods_match),
            "baselines": {name: ratios(used[name]) for name in ("first_fit", "slurm_tree")}}


# -- entry point -----------------------------------------------------------------------------

REPLAY = {"jobs": 3000, "load": 0.9, "cycle_s": 600.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobmix", help="CSV job_id,gpus,priority,submit_order (slurm-peer format)")
    parser.add_argument("--topology", help="Slurm topology.conf (tree format) for --jobmix")
    parser.add_argument("--load", type=float, default=REPLAY["load"],
                        help=f"replay: offered load as a share of the GPUs (default {REPLAY['load']})")
    parser.add_argument("--window", type=int, default=0,
                        help=f"replay: ITP jobs {REPLAY['jobs']} x WINDOW onwards (default 0)")
    parser.add_argument("--cases", type=int, default=200, help="exact-solver cases (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if bool(args.jobmix) != bool(args.topology):
        parser.error("--jobmix and --topology go together")
    if not 0 < args.load <= 10:
        parser.error(f"--load must be above 0 and at most 10, not {args.load}")
    if args.window < 0:
        parser.error(f"--window must be 0 or more, not {args.window}")
    try:
        if args.jobmix:
            cluster = read_topology_conf(args.topology)
            jobs = [QJob(j.job_id, j.gpus, j.priority, j.submit_order) for j in read_jobmix(args.jobmix)]
            workload = {"protocol": "slurm-peer: fill, then twice stop 30 % (sha1 rule) and refill",
                        "jobmix": args.jobmix, "topology": args.topology}
            policies = {name: run_protocol(cluster, jobs, name, args.seed) for name in POLICIES}
        else:
            cluster = fat_tree(leaves=8, hosts_per_leaf=16, pods=2)
            jobs, factor = replay_jobs(REPLAY["jobs"], cluster, args.load, args.window)
            first = REPLAY["jobs"] * args.window
            workload = {"protocol": f"replay of ITP cluster04 jobs {first}-{first + len(jobs) - 1}, arrivals "
                                    f"{factor:.2f}x faster (offered load {args.load:.0%}), a cycle every "
                                    f"{REPLAY['cycle_s']:.0f} s",
                        "fabric": "3-tier: 2 pods x 4 leaves x 16 hosts x 8 GPUs"}
            policies = {name: run_replay(cluster, jobs, name, REPLAY["cycle_s"]) for name in POLICIES}
        exact = exact_cases(args.cases, args.seed)
    except (DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"workload": workload, "hosts": cluster.hosts, "gpus": cluster.gpus,
                      "leaves": len(cluster.leaf_names), "jobs": len(jobs), "policies": policies, "exact": exact},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
