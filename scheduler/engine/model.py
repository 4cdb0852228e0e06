"""The engine's plain data: what a cycle feeds in (a Snapshot) and what comes out (a Plan).

Ids are whatever the caller uses (database primary keys in the cycle, small ints in tests);
they only need to be hashable, and job ids comparable among themselves (the last
tie-break of the queue order). Times are seconds on one clock (`Snapshot.now`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

# Why a job waits. Stable codes: the cycle stores them, the dashboard groups by them.
RESOURCES = "resources"  # not enough free GPUs of the right shape; waits for running jobs
PRIORITY = "priority"  # it fitted at the start of the cycle; higher-ranked jobs took the room
QUOTA = "quota"  # over its tenant's limit, or borrowing what others' guarantees need
TOPOLOGY_WAIT = "topology_wait"  # fits, but not within its leaf-switch limit yet
CONSTRAINTS = "constraints"  # no set of GPUs in its pool can ever satisfy it
UNHEALTHY_HOSTS = "unhealthy_hosts"  # only hosts/GPUs marked unhealthy could satisfy it
RESERVED = "reserved_for_higher_priority"  # fits only on GPUs held for a higher-ranked job
REASONS = (RESOURCES, PRIORITY, QUOTA, TOPOLOGY_WAIT, CONSTRAINTS, UNHEALTHY_HOSTS, RESERVED)

# Queue orders within a priority (Snapshot.order).
AGE, SHORT_FIRST = "age", "short_first"
ORDERS = (AGE, SHORT_FIRST)

# Decision kinds (Placement.kind).
PLACE, PREEMPTION, REMOTE, REBALANCE = "place", "preemption", "remote", "rebalance"


class SnapshotError(ValueError):
    """The snapshot itself is inconsistent (unknown host, duplicate id...). Nothing is planned."""


@dataclass(frozen=True, slots=True)
class Gpu:
    id: Hashable
    host: Hashable
    index: int = 0
    model: str = ""
    memory_mib: int = 0
    fp64: str = "unknown"  # the pool's FP64 class: "high", "low" or "unknown"
    free: bool = True  # not in any active placement (running placements are also subtracted)
    healthy: bool = True
    # sharing: a partly shared GPU (free=False) with what its fractional jobs hold.
    used_milli: int = 0
    used_memory_mib: int = 0
    mig_slices: int = 0


@dataclass(frozen=True, slots=True)
class Host:
    id: Hashable
    name: str
    # Leaf switches this host is cabled to: one on a classic fat-tree, one per rail on a
    # rail-optimized fabric. The engine groups hosts by the sorted tuple of their leaves (the
    # "placement leaf") and counts that group as one leaf: on a rail-optimized fabric the
    # hosts of one rail group share all their leaves, so the group behaves like one leaf.
    leaves: tuple = ()
    pool: Hashable = None
    site: str = ""
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Leaf:
    id: Hashable
    name: str = ""
    pod: Hashable = None  # spine group / pod; None on a 2-tier fabric (one pod)
    # 0 = all uplinks up and clean, 1 = cut off from the spines. Leaves at 1 are used only
    # for jobs that fit inside them.
    health_penalty: float = 0.0


@dataclass(frozen=True, slots=True)
class Pod:
    id: Hashable
    name: str = ""


@dataclass(frozen=True, slots=True)
class Running:
    """An active placement (proposed, approved or running): its GPUs are taken."""
    job_id: Hashable
    gpu_ids: tuple
    tenant: Hashable = None
    pool: Hashable = None
    expected_end: float | None = None  # None: unknown, so its GPUs are never counted on
    preemptible: bool = False
    # Policies (scheduler.engine.policies): who may be preempted or moved, and in what order.
    priority: int = 0
    borrowed: bool = False  # beyond its tenant's guarantee when placed: reclaimable
    start: float | None = None  # when it started (None: not yet): youngest are preempted first
    task_class: str = "training"
    restartable: bool = False  # may be stopped and restarted elsewhere (rebalancing)
    placement: Hashable = None  # the caller's placement id (the cycle's Placement pk)
    # sharing: a fractional job's share of one GPU (a Fraction, e.g. 3/10 or 3/7 for MIG 3g),
    # counted against its tenant's quota instead of len(gpu_ids); its gpu_ids are then empty
    # (the GPU's Gpu.used_milli carries the share for packing).
    share: object = 0

    @property
    def quota_gpus(self):
        """What it counts against its tenant's quota: its share, else its whole GPUs."""
        return self.share if self.share else len(self.gpu_ids)


@dataclass(frozen=True, slots=True)
class Constraints:
    # GPU model names; each matches a GPU whose model contains it as whole words, case
    # insensitive ("H100" matches "NVIDIA H100 80GB HBM3" but "H20" does not match "H200").
    models: frozenset = frozenset()
    min_memory_mib: int = 0
    fp64: str | None = None  # required FP64 class, e.g. "high"
    site: str | None = None


@dataclass(frozen=True, slots=True)
class TopologyRequirement:
    """At most `max_leaves` leaf switches, like Slurm's --switches=N@wait. A soft
    requirement is dropped once the job has waited `max_wait_s` since submission."""
    max_leaves: int
    hard: bool = True
    max_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Job:
    id: Hashable
    tenant: Hashable
    pool: Hashable
    gpus: int
    constraints: Constraints = Constraints()
    task_class: str = "training"
    priority: int = 0
    submit_time: float = 0.0
    gang: bool = True  # all GPUs at once; a non-gang job may start on fewer (at least one)
    estimated_runtime: float | None = None
    max_runtime: float | None = None
    topology: TopologyRequirement | None = None
    # A job larger than one host takes whole free hosts (ceil(N / host size) of them), as
    # Slurm's --exclusive does; False lets it use free GPUs of partly used hosts too.
    whole_hosts: bool = True
    # Sites: constraints.site is its home site. With allow_remote_site, once it has waited
    # remote_after_s without starting there, another site may be proposed (never a split gang).
    allow_remote_site: bool = False
    remote_after_s: float = 0.0
    # sharing: a fraction of one GPU (engine.sharing); gpus is then 1.
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str = ""


@dataclass(frozen=True, slots=True)
class ClassRule:
    """How the engine treats one task class (TaskClassRule rows, else settings defaults)."""
    pack_tightly: bool = True  # fewest leaves first: the default cost order (False changes nothing yet)
    prefer_healthy_leaves: bool = False  # latency-sensitive: avoid leaves with degraded uplinks
    prefer_lightly_loaded: bool = False  # latency-sensitive: the emptiest healthy leaf, not the fullest
    preemptible: bool = True  # False: never a preemption victim, whatever the job says
    requires_fp64: str = ""  # e.g. "high": added to jobs of this class that name no FP64 class
    leftovers_only: bool = False  # after every other class in the queue; holds no reservation
    whole_gpus: bool = True  # (GPU sharing decides; kept here so rules travel as one value)

    @property
    def latency_sensitive(self) -> bool:
        return self.prefer_healthy_leaves or self.prefer_lightly_loaded


@dataclass(frozen=True, slots=True)
class SiteLink:
    """A wide-area link between two sites."""
    latency_ms: float
    bandwidth_gbps: float
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Quota:
    guaranteed: int = 0
    limit: int | None = None  # None: no limit
    usage: float = 0.0  # decayed usage (any unit, compared with the guarantee for fair share)


@dataclass
class Snapshot:
    gpus: Sequence[Gpu]
    hosts: Sequence[Host]
    leaves: Sequence[Leaf] = ()
    pods: Sequence[Pod] = ()
    running: Sequence[Running] = ()
    queue: Sequence[Job] = ()
    # (tenant, pool) -> Quota. A tenant without one has no guarantee and no limit. In a pool
    # where some tenant has a guarantee, all it runs there is borrowed (reclaimable) and only
    # from GPUs no guarantee needs; in a pool without guarantees nothing is borrowed.
    quotas: Mapping[tuple, Quota] = field(default_factory=dict)
    now: float = 0.0
    # Policies (all optional; empty = the plain engine).
    class_rules: Mapping[str, ClassRule] = field(default_factory=dict)  # task class -> rule
    site_links: Mapping[frozenset, SiteLink] = field(default_factory=dict)  # frozenset({a, b}) -> link
    gpu_idle_s: Mapping[Hashable, float] = field(default_factory=dict)  # GPU id -> seconds at ~0 % utilization
    idle_threshold_s: float = 3600.0  # rebalancing: allocated GPUs idle longer than this are reported
    # Order within one priority and fair-share level (engine.plan.queue_order): "age" (oldest
    # first) or "short_first" (least estimated GPU-seconds first, for less average queueing;
    # a job without an estimate or maximum run time counts as endless). Under short_first a
    # job that has waited `order_max_wait_s` goes ahead of those by age, so none starves.
    order: str = "age"
    order_max_wait_s: float = 4 * 3600.0


@dataclass(frozen=True, slots=True)
class Cost:
    """The cost of a placement, compared in this order (smaller is better)."""
    hosts: int
    leaves: int  # placement leaves (see Host.leaves)
    pod_crossings: int  # pods used minus one
    health_penalty: float  # the worst penalty among the leaves used
    fragmentation_left: int  # GPUs left free on the hosts it uses (unusable for whole-host jobs)

    def key(self) -> tuple:
        return (self.hosts, self.leaves, self.pod_crossings, self.health_penalty, self.fragmentation_left)

    def as_dict(self) -> dict:
        return {"hosts": self.hosts, "leaves": self.leaves, "pod_crossings": self.pod_crossings,
                "health_penalty": self.health_penalty, "fragmentation_left": self.fragmentation_left}


@dataclass(slots=True)
class Decision:
    job_id: Hashable
    rank: int  # position in the queue order, 0 first
    placed: bool
    message: str  # one or two sentences for a person
    reason: str | None = None  # one of REASONS when pending
    gpu_ids: tuple = ()
    host_ids: tuple = ()
    leaves: tuple = ()  # leaf ids used (every leaf of every placement leaf used)
    pods: tuple = ()
    leaves_lower_bound: int | None = None  # fewest leaves any placement could use now
    cost: Cost | None = None
    borrowed: bool = False  # some of its GPUs are beyond the tenant's guarantee: reclaimable
    borrowed_gpus: int = 0
    partial: bool = False  # a non-gang job started on fewer GPUs than it asked for
    expected_start: float | None = None  # when known (the job holding the reservation)
    # Policies: "place", "preemption" (its GPUs are held by `victims` until they stop) or
    # "remote" (at `site`, away from home). `gains`: what it costs and gains, for people.
    kind: str = "place"
    site: str = ""
    victims: tuple = ()  # job ids
    gains: dict = field(default_factory=dict)
    shares: tuple = ()  # sharing: ((gpu id, milli, memory MiB, MIG device), ...) for a fractional job

    @property
    def status(self) -> str:
        return "placed" if self.placed else "pending"


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: Hashable
    start: float
    gpu_ids: tuple


@dataclass(frozen=True, slots=True)
class Move:
    """Rebalancing: stop a restartable running job and restart it (on `to_gpus` if given)."""
    job_id: Hashable
    placement: Hashable
    from_gpus: tuple
    to_gpus: tuple
    why: str  # "idle", "fragmentation" or "queue"
    message: str
    gains: dict


@dataclass
class Plan:
    decisions: list[Decision]  # one per queued job, in queue order
    reservation: Reservation | None = None
    moves: list[Move] = field(default_factory=list)  # rebalancing proposals

    def by_job(self) -> dict:
        return {d.job_id: d for d in self.decisions}

    @property
    def placed(self) -> list[Decision]:
        return [d for d in self.decisions if d.placed]

    def pending_reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.decisions:
            if not d.placed:
                counts[d.reason] = counts.get(d.reason, 0) + 1
        return counts
