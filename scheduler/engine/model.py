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

    @property
    def status(self) -> str:
        return "placed" if self.placed else "pending"


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: Hashable
    start: float
    gpu_ids: tuple


@dataclass
class Plan:
    decisions: list[Decision]  # one per queued job, in queue order
    reservation: Reservation | None = None

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
