"""Shared pieces of the scheduler benchmarks (pure Python, no Django): synthetic fat-tree
clusters as engine snapshots, the ITP trace's job sizes and run times, and the slurm-peer
job mix and Slurm topology.conf readers.

Reference data lives in ../shared/sched/ (a sibling of the repository on developer machines
and in CI); `shared_file` says clearly when it is missing.
"""
from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from fabric.hostlist import expand
from scheduler.engine import Gpu, Host, Job, Leaf, Pod, Running, Snapshot

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "sched"
ITP_TRACE = "traces/msft_itp_cluster04.csv"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81559


class DataError(Exception):
    """A reference file is missing or malformed; the message names it (and the line)."""


def shared_file(relative: str) -> Path:
    path = SHARED / relative
    if not path.is_file():
        raise DataError(f"{path} not found: the scheduler benchmarks read reference data from ../shared/sched/ "
                        "next to the repository (present on developer machines and in CI).")
    return path


# -- clusters --------------------------------------------------------------------------------

@dataclass
class Cluster:
    """Hosts of `gpus_per_host` GPUs, each under one leaf; leaves grouped in pods."""
    host_names: list[str]
    host_leaf: list[int]  # host index -> leaf index
    leaf_names: list[str]
    leaf_pod: list[int | None]
    pod_names: list[str]
    gpus_per_host: int = 8
    leaf_penalty: dict[int, float] = field(default_factory=dict)

    @property
    def hosts(self) -> int:
        return len(self.host_names)

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    def gpu_id(self, host: int, index: int) -> int:
        return host * self.gpus_per_host + index

    def host_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_host

    def snapshot(self, busy=(), running=(), queue=(), quotas=None, now: float = 0.0) -> Snapshot:
        busy = set(busy)
        gpus = [Gpu(id=self.gpu_id(h, i), host=h, index=i, model=GPU_MODEL, memory_mib=GPU_MEMORY_MIB, fp64="high",
                    free=self.gpu_id(h, i) not in busy)
                for h in range(self.hosts) for i in range(self.gpus_per_host)]
        hosts = [Host(id=h, name=name, leaves=(self.host_leaf[h],), pool="default")
                 for h, name in enumerate(self.host_names)]
        leaves = [Leaf(id=l, name=name, pod=self.leaf_pod[l], health_penalty=self.leaf_penalty.get(l, 0.0))
                  for l, name in enumerate(self.leaf_names)]
        pods = [Pod(id=p, name=name) for p, name in enumerate(self.pod_names)]
        return Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=pods, running=list(running), queue=list(queue),
                        quotas=quotas or {}, now=now)


def fat_tree(leaves: int, hosts_per_leaf: int, pods: int = 1, gpus_per_host: int = 8) -> Cluster:
    """`leaves` leaves of `hosts_per_leaf` hosts, split evenly into `pods` pods (1: 2-tier)."""
    if leaves % pods:
        raise ValueError(f"{leaves} leaves do not split evenly into {pods} pods")
    per_pod = leaves // pods
    host_names, host_leaf = [], []
    for l in range(leaves):
        for _ in range(hosts_per_leaf):
            host_leaf.append(l)
            host_names.append(f"gpu{len(host_names) + 1:04d}")
    leaf_names = [f"p{l // per_pod + 1}-leaf{l + 1:03d}" if pods > 1 else f"leaf{l + 1:03d}" for l in range(leaves)]
    leaf_pod = [l // per_pod for l in range(leaves)]
    return Cluster(host_names, host_leaf, leaf_names, leaf_pod, [f"pod{p + 1}" for p in range(pods)], gpus_per_host)


def read_topology_conf(path: Path | str, gpus_per_host: int = 8) -> Cluster:
    """A Slurm topology/tree file: leaf switches are lines with Nodes=, higher switches
    (Switches=) group them; a switch directly under the root is a pod when there are
    several levels, otherwise the fabric is one pod."""
    path = Path(path)
    nodes_of: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        name = fields.get("SwitchName")
        if not name:
            raise DataError(f"{path}:{number}: expected SwitchName=..., got {raw.strip()!r}")
        if "Nodes" in fields:
            nodes_of[name] = expand(fields["Nodes"])
        elif "Switches" in fields:
            children[name] = expand(fields["Switches"])
        else:
            raise DataError(f"{path}:{number}: switch {name} has neither Nodes= nor Switches=")
    if not nodes_of:
        raise DataError(f"{path}: no leaf switch (SwitchName=... Nodes=...) found")
    parent = {c: p for p, cs in children.items() for c in cs}
    for c in parent:
        if c not in nodes_of and c not in children:
            raise DataError(f"{path}: switch {c} is listed under {parent[c]} but never defined")

    def pod_of(leaf: str) -> str | None:
        chain = [leaf]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]])
        return chain[-2] if len(chain) >= 3 else None  # the switch just below the root

    leaf_names = list(nodes_of)
    pods = sorted({p for p in map(pod_of, leaf_names) if p is not None})
    host_names, host_leaf = [], []
    seen = set()
    for l, leaf in enumerate(leaf_names):
        for node in nodes_of[leaf]:
            if node in seen:
                raise DataError(f"{path}: node {node} is under two leaf switches")
            seen.add(node)
            host_names.append(node)
            host_leaf.append(l)
    leaf_pod = [pods.index(pod_of(leaf)) if pod_of(leaf) is not None else 0 for leaf in leaf_names]
    return Cluster(host_names, host_leaf, leaf_names, leaf_pod, pods or ["root"], gpus_per_host)


# -- workloads ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceJob:
    submit: float
    duration: float
    gpus: int


def itp_jobs(path: Path | str | None = None) -> list[TraceJob]:
    """The ITP cluster04 trace (MIT, Microsoft; see traces/SOURCES.md), in submission order."""
    path = Path(path) if path else shared_file(ITP_TRACE)
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for number, row in enumerate(reader, 2):
            try:
                out.append(TraceJob(float(row["submission_time"]), float(row["duration"]), int(row["num_gpu"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"{path}:{number}: bad row ({exc})") from None
    if not out:
        raise DataError(f"{path}: no jobs")
    return out


@dataclass(frozen=True)
class MixJob:
    job_id: str
    gpus: int
    priority: int
    submit_order: int


def read_jobmix(path: Path | str) -> list[MixJob]:
    """`job_id,gpus,priority,submit_order` (the slurm-peer format), sorted by submit_order."""
    path = Path(path)
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"job_id", "gpus", "priority", "submit_order"} - set(reader.fieldnames or ())
        if missing:
            raise DataError(f"{path}: missing columns {', '.join(sorted(missing))}")
        for number, row in enumerate(reader, 2):
            try:
                job = MixJob(row["job_id"], int(row["gpus"]), int(row["priority"]), int(row["submit_order"]))
            except (TypeError, ValueError) as exc:
                raise DataError(f"{path}:{number}: bad row ({exc})") from None
            if job.gpus < 1:
                raise DataError(f"{path}:{number}: gpus must be at least 1")
            out.append(job)
    return sorted(out, key=lambda j: j.submit_order)


def half_full(cluster: Cluster, trace: list[TraceJob], rng: random.Random, fraction: float = 0.5,
              now: float = 0.0) -> tuple[list[Running], set[int]]:
    """Running placements of trace-sized jobs at random spots until `fraction` of GPUs are
    busy: small jobs on a random host with room, larger ones on random whole hosts."""
    g = cluster.gpus_per_host
    free = [g] * cluster.hosts
    running, busy = [], set()
    target = int(cluster.gpus * fraction)
    n = 0
    while len(busy) < target:
        tj = rng.choice(trace)
        size = min(tj.gpus, target - len(busy))
        if size <= g:
            hosts = [h for h in rng.sample(range(cluster.hosts), min(64, cluster.hosts)) if free[h] >= size][:1]
            parts = [(h, size) for h in hosts]
        else:
            need = -(-size // g)
            whole = [h for h in rng.sample(range(cluster.hosts), min(cluster.hosts, need * 16)) if free[h] == g]
            parts = [(h, g) for h in whole[:need]]
            if len(parts) < need:
                continue
            parts[-1] = (parts[-1][0], size - g * (need - 1))
        if not parts:
            continue
        gpus = []
        for h, k in parts:
            first = g - free[h]
            gpus += [cluster.gpu_id(h, i) for i in range(first, first + k)]
            free[h] -= k
        busy.update(gpus)
        n += 1
        running.append(Running(job_id=f"run{n}", gpu_ids=tuple(gpus), tenant=f"team{n % 4}", pool="default",
                               expected_end=now + tj.duration))
    return running, busy


def pending_jobs(count: int, trace: list[TraceJob], rng: random.Random, tenants: int = 4,
                 now: float = 0.0) -> list[Job]:
    """`count` queued jobs with sizes and run times drawn from the trace."""
    jobs = []
    for i in range(count):
        tj = rng.choice(trace)
        jobs.append(Job(id=i, tenant=f"team{i % tenants}", pool="default", gpus=tj.gpus,
                        priority=rng.choice((0, 0, 0, 10, 20)), submit_time=now - rng.uniform(0, 3600),
                        estimated_runtime=tj.duration))
    return jobs


def unusable_for_8gpu(free_per_host, host_size: int = 8) -> int:
    """FGD's fragmentation measure: free GPUs on hosts with fewer than `host_size` free
    (those GPUs cannot serve a job that needs a whole 8-GPU host)."""
    return sum(f for f in free_per_host if f < host_size)
