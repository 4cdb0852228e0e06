"""One allocation cycle over a Snapshot: order, quotas, placement, backfill, explanations.

Queue order: priority (high first), then fair share (decayed usage / guarantee, low first; a
tenant without a guarantee comes after those with one), then age, then job id.

Quotas, per tenant and pool: a job may never take the tenant past its limit. GPUs up to the
guarantee are the tenant's own; GPUs beyond it are borrowed (marked reclaimable) and only
from idle GPUs: after the job, the pool must still have enough free GPUs for every other
tenant's unmet guarantee that has demand now (min(guarantee - used, GPUs its queued jobs
ask for)).

Backfill: the first job in order that cannot start for lack of room (resources, priority or
topology) gets a reservation: the earliest time its GPUs will be free, from the expected
ends of running placements and of those made earlier in this cycle (estimated run time, else
maximum), and the GPUs it will take then (the best placement at that time). Those GPUs that
are free now are held: later jobs use other GPUs, or held ones only if their estimated run
time ends before the reservation starts.

Task classes (Snapshot.class_rules): a class that requires an FP64 class gets it as a
constraint; latency-sensitive classes go to leaves with healthy uplinks, the least loaded
first, when any can hold them; leftovers-only classes come after every other job and hold
no reservation. Then scheduler.engine.policies adds preemptions, remote sites and moves.

Speed: within a cycle free room only shrinks, so once a job of N GPUs of some class and
shape failed, every later job of that class and shape with N or more fails too; that is
remembered (per class, shape, with or without the held GPUs) and answers them in O(1).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .index import Capacity, Fabric, FreeIndex, Leaves
from .model import (CONSTRAINTS, ORDERS, PRIORITY, QUOTA, RESERVED, RESOURCES, SHORT_FIRST, TOPOLOGY_WAIT,
                    UNHEALTHY_HOSTS, ClassRule, Decision, Cost, Job, Plan, Quota, Reservation, Snapshot, SnapshotError)
from .placement import LOOSE, PARTIAL, SINGLE, WHOLE, choose, describe

NO_QUOTA = Quota()
NO_RULE = ClassRule()
INF = math.inf


def prepare(snapshot: Snapshot) -> Fabric:
    """The snapshot's hardware, numbered and indexed once, for `plan(..., fabric=)` over many
    snapshots that share the same gpus, hosts, leaves and pods sequences (only running, queue,
    quotas and now change), as a trace replay does. Raises SnapshotError like plan."""
    return Fabric(snapshot)


def plan(snapshot: Snapshot, *, policies: bool = True, fabric: Fabric | None = None) -> Plan:
    """Decide every queued job, then (policies) propose preemptions, remote sites and moves.
    `fabric`: from prepare() on a snapshot with the same hardware sequences (else SnapshotError);
    None builds it from this snapshot. Raises SnapshotError if the snapshot contradicts itself."""
    cycle = _Cycle(snapshot, fabric)
    result = cycle.run()
    if policies:
        from .policies import apply  # policies build on this module

        apply(cycle, result)
    return result


def queue_order(snapshot: Snapshot) -> list[Job]:
    """Priority, fair share, then age (Snapshot.order "age") or, under "short_first", the
    jobs waiting `order_max_wait_s` or more by age, then the rest by estimated GPU-seconds.
    Raises SnapshotError for an unknown order."""
    quotas = snapshot.quotas
    # Classes that take what is left (rendering by default) come after every other job.
    last = {c for c, r in snapshot.class_rules.items() if r.leftovers_only}
    if snapshot.order not in ORDERS:
        raise SnapshotError(f"unknown queue order {snapshot.order!r}: expected one of {', '.join(ORDERS)}")

    def fair_share(job):
        q = quotas.get((job.tenant, job.pool), NO_QUOTA)
        return q.usage / q.guaranteed if q.guaranteed > 0 else INF

    if snapshot.order == SHORT_FIRST:
        waited_enough = snapshot.now - snapshot.order_max_wait_s

        def within(j):  # small, short jobs first: the least queueing in total (SJF)
            if j.submit_time <= waited_enough:
                return (0, j.submit_time, 0.0, j.id)
            rt = runtime(j)
            gpus = j.gpus if isinstance(j.gpus, int) and j.gpus > 0 else 1  # a bad count is refused later
            return (1, INF if rt is None else rt * gpus, j.submit_time, j.id)
    else:
        def within(j):
            return (j.submit_time, j.id)

    if last:
        return sorted(snapshot.queue, key=lambda j: (j.task_class in last, -j.priority, fair_share(j), within(j)))
    return sorted(snapshot.queue, key=lambda j: (-j.priority, fair_share(j), within(j)))


def gpus_text(x) -> str:
    """A GPU count for people: whole counts as before, shares (Fractions) to 3 digits."""
    return str(int(x)) if x == int(x) else f"{float(x):.3g}"


def runtime(job: Job) -> float | None:
    return job.estimated_runtime if job.estimated_runtime is not None else job.max_runtime


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} d {hours % 24} h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Class:
    """Everything about one set of eligible GPUs (pool, site, GPU kinds)."""

    def __init__(self, fab: Fabric, pool, site, kinds, free: set, initial_free: set):
        static = fab.class_cache.get((pool, site, kinds))
        if static is None:  # the same for every cycle on this fabric
            elig = fab.eligible(pool, site, kinds, healthy_only=True)
            elig_any = fab.eligible(pool, site, kinds, healthy_only=False)
            static = fab.class_cache[(pool, site, kinds)] = (
                elig, max((len(ids) for ids in elig_any.values()), default=0),
                Capacity(fab, elig_any, None, ignore_health=True),  # every matching GPU, all free
                Capacity(fab, elig, None),  # healthy ones, all free
                frozenset(i for ids in elig.values() for i in ids))
        self.elig, self.host_max, self.ever, self.healthy, members = static
        self.idx = FreeIndex(fab, self.elig, free, members)
        # As the cycle found them (free only shrinks, so equal sizes mean the same set).
        self.initial = (Capacity.of(self.idx) if len(free) == len(initial_free)
                        else Capacity(fab, self.elig, initial_free))
        self.failed: dict = {}  # (mode, with_held) -> smallest N that failed


class _Cycle:
    def __init__(self, snap: Snapshot, fabric: Fabric | None = None):
        self.snap = snap
        self.now = snap.now
        if fabric is not None and not fabric.matches(snap):
            raise SnapshotError("the prepared fabric was built from other GPUs, hosts, leaves or pods than this "
                                "snapshot's; prepare it from the same sequences (engine.prepare)")
        self.fab = fab = fabric if fabric is not None else Fabric(snap)
        busy: dict = {}
        self.releases: list[tuple[float, tuple]] = []
        self.used: dict = {}
        known = fab.gpu.__contains__
        for r in snap.running:
            ids = r.gpu_ids
            before = len(busy)
            busy.update(dict.fromkeys(ids, r.job_id))  # fast path; errors are found again below
            if len(busy) != before + len(ids) or not all(map(known, ids)):
                self._bad_running(snap)
            key = (r.tenant, r.pool)
            self.used[key] = self.used.get(key, 0) + r.quota_gpus  # sharing: a share counts as its fraction
            if r.expected_end is not None:
                self.releases.append((max(r.expected_end, self.now), tuple(r.gpu_ids)))
        # Usable now: free, healthy, on a healthy host, and held by no running job.
        self.free = set(fab.usable)
        self.free.difference_update(busy)
        self.initial_free = frozenset(self.free)
        self.pool_free: dict = {}
        host_pool, gpu_host = fab.host_pool, fab.gpu_host
        for i in self.free:
            p = host_pool[gpu_host[i]]
            self.pool_free[p] = self.pool_free.get(p, 0) + 1
        self.quotas = snap.quotas
        # Borrowing only means something where someone has a guarantee to reclaim for.
        self.guaranteed_pools = {pool for (_, pool), q in self.quotas.items() if q.guaranteed > 0}
        self.demand: dict = {}
        for job in snap.queue:
            if isinstance(job.gpus, int) and job.gpus > 0:
                key = (job.tenant, job.pool)
                self.demand[key] = self.demand.get(key, 0) + job.gpus
        self.reserve: dict = {}  # (tenant, pool) -> GPUs its unmet guarantee needs now
        self.pool_reserve: dict = {}
        for key in set(self.quotas) | set(self.demand):
            self._update_reserve(key)
        self.classes: dict = {}
        self.reservation: Reservation | None = None
        self.reservation_tried = False
        self.held: set = set()  # free GPUs of the reservation, kept out of the indexes

    def _bad_running(self, snap: Snapshot) -> None:
        """Raise SnapshotError naming the first unknown or doubly held GPU of the running jobs."""
        busy: dict = {}
        for r in snap.running:
            for i in r.gpu_ids:
                if i not in self.fab.gpu:
                    raise SnapshotError(f"running job {r.job_id!r} holds unknown GPU {i!r}")
                if i in busy:
                    raise SnapshotError(f"GPU {i!r} is held by both job {busy[i]!r} and job {r.job_id!r}")
                busy[i] = r.job_id

    # -- bookkeeping -----------------------------------------------------------------------
    def quota(self, tenant, pool) -> Quota:
        return self.quotas.get((tenant, pool), NO_QUOTA)

    def _update_reserve(self, key) -> None:
        q = self.quota(*key)
        new = min(max(0, q.guaranteed - self.used.get(key, 0)), max(0, self.demand.get(key, 0)))
        old = self.reserve.get(key, 0)
        if new != old:
            self.reserve[key] = new
            self.pool_reserve[key[1]] = self.pool_reserve.get(key[1], 0) + new - old

    def _borrowed(self, job: Job, used: int, n: int) -> int:
        if job.pool not in self.guaranteed_pools:
            return 0
        q = self.quota(job.tenant, job.pool)
        return max(0, used + n - max(q.guaranteed, used))

    def _drop_demand(self, job: Job) -> None:
        key = (job.tenant, job.pool)
        if key in self.demand:
            self.demand[key] -= job.gpus
            self._update_reserve(key)

    def class_for(self, job: Job) -> _Class:
        c = job.constraints
        kinds = self.fab.eligible_kinds(c)
        key = (job.pool, c.site, kinds)
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = _Class(self.fab, job.pool, c.site, kinds, self.free, self.initial_free)
        return cls

    def _take(self, gpu_ids) -> None:
        self.free.difference_update(gpu_ids)
        for cls in self.classes.values():
            cls.idx.take(gpu_ids)
        self._count_pool(gpu_ids, -1)

    def _give(self, gpu_ids) -> None:
        self.free.update(gpu_ids)
        for cls in self.classes.values():
            cls.idx.give(gpu_ids)
        self._count_pool(gpu_ids, +1)

    def _count_pool(self, gpu_ids, sign: int) -> None:
        fab = self.fab
        for i in gpu_ids:
            p = fab.host_pool[fab.gpu_host[i]]
            self.pool_free[p] = self.pool_free.get(p, 0) + sign

    # -- the cycle ---------------------------------------------------------------------------
    def rule(self, job: Job) -> ClassRule:
        return self.snap.class_rules.get(job.task_class, NO_RULE)

    def run(self) -> Plan:
        jobs = queue_order(self.snap)
        rules = self.snap.class_rules
        # Class rules as sets of class names: a set lookup per job is all the plain path pays.
        self.latency_classes = {c for c, r in rules.items() if r.latency_sensitive}
        self.leftover_classes = {c for c, r in rules.items() if r.leftovers_only}
        if any(r.requires_fp64 for r in rules.values()):
            # A class that needs FP64 (science) gets it as a constraint unless the job names one.
            jobs = [replace(j, constraints=replace(j.constraints, fp64=rules[j.task_class].requires_fp64))
                    if j.task_class in rules and rules[j.task_class].requires_fp64 and j.constraints.fp64 is None
                    else j for j in jobs]
        self.jobs = jobs
        decisions = [self.decide(rank, job) for rank, job in enumerate(jobs)]
        return Plan(decisions=decisions, reservation=self.reservation)

    def decide(self, rank: int, job: Job) -> Decision:
        def pending(reason, message, **kw):
            return Decision(job_id=job.id, rank=rank, placed=False, reason=reason, message=message, **kw)

        # sharing: a job asking for a fraction of one GPU is packed by engine.sharing.
        if job.gpu_milli or job.gpu_memory_mib or job.mig_profile:
            from .sharing import decide as decide_shared
            return decide_shared(self, rank, job)
        # sharing: end
        n = job.gpus
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return pending(CONSTRAINTS, f"It asks for {n!r} GPUs; a job needs a whole number of at least 1.")
        topo = job.topology
        if topo is not None and (not isinstance(topo.max_leaves, int) or topo.max_leaves < 1):
            self._drop_demand(job)
            return pending(CONSTRAINTS, f"Its topology limit of {topo.max_leaves!r} leaf switches is not a "
                                        "whole number of at least 1.")
        cls = self.class_for(job)
        if cls.host_max == 0:
            self._drop_demand(job)
            what = self._describe_constraints(job)
            if not self.fab.pool_hosts.get(job.pool):
                return pending(CONSTRAINTS, f"Pool {job.pool!r} has no hosts.")
            return pending(CONSTRAINTS, f"No GPU in pool {job.pool!r} matches {what}.")
        mode = SINGLE if n <= cls.host_max else (WHOLE if job.whole_hosts else LOOSE)
        shape = self._shape(n, mode)

        # Could it ever run here (every matching GPU free), and on healthy hosts only?
        for cap, reason in ((cls.ever, CONSTRAINTS), (cls.healthy, UNHEALTHY_HOSTS)):
            k = self._fewest_leaves(cap, mode, n)
            if k is None or (topo is not None and topo.hard and k > topo.max_leaves):
                self._drop_demand(job)
                return pending(reason, self._never_message(job, cls, mode, n, reason, k))

        tenant_key = (job.tenant, job.pool)
        q = self.quota(job.tenant, job.pool)
        used = self.used.get(tenant_key, 0)
        want = n
        if q.limit is not None and used + n > q.limit:
            room = math.floor(q.limit - used)  # shares in use make `used` fractional
            if job.gang or room < 1:
                self._drop_demand(job)
                return pending(QUOTA, f"Tenant {job.tenant} would use {gpus_text(used + n)} GPUs in pool {job.pool}, "
                                      f"over its limit of {q.limit} ({gpus_text(used)} in use).")
            want = room
        borrowed = self._borrowed(job, used, want)
        if borrowed:
            others_need = self.pool_reserve.get(job.pool, 0) - self.reserve.get(tenant_key, 0)
            idle = math.floor(self.pool_free.get(job.pool, 0) - others_need)
            if want > idle:
                own = math.floor(max(0, q.guaranteed - used))
                if not job.gang and max(idle, own) >= 1:
                    want = max(idle, own)
                else:
                    return pending(QUOTA, f"It would borrow {gpus_text(borrowed)} GPUs beyond tenant {job.tenant}'s "
                                          f"guarantee of {q.guaranteed} in pool {job.pool}, but only {max(idle, 0)} "
                                          "free GPUs are not needed by other tenants' guarantees.")

        limit = self._active_limit(job)
        latency = job.task_class in self.latency_classes
        gpus, k_now = self._try(cls, mode, want, limit, held=False, latency=latency)
        if gpus is None and self.held and self._ends_before_reservation(job):
            # Short enough to finish before the reservation starts: the held GPUs may serve.
            self._release_held()
            gpus, _ = self._try(cls, mode, want, limit, held=True, latency=latency)
            decision = self._placed(rank, job, cls, mode, gpus, limit) if gpus is not None else None
            self._hold_again()
            if decision is not None:
                return decision
        if gpus is None and not job.gang and cls.idx.total_free:
            gpus, _ = choose(cls.idx, PARTIAL, want, limit)
            if gpus is not None:
                return self._placed(rank, job, cls, PARTIAL, gpus, limit)
        if gpus is not None:
            return self._placed(rank, job, cls, mode, gpus, limit)

        # Why it waits.
        expected = None
        if limit is not None and k_now is not None:
            reason = TOPOLOGY_WAIT
            message = f"topology: needs ≤ {limit} leaves, best now {k_now}."
            if not topo.hard:
                relax = job.submit_time + topo.max_wait_s
                message += f" The limit is soft and is dropped in {duration(relax - self.now)}."
        elif self.held and self._fits_with_held(cls, mode, want, limit):
            reason = RESERVED
            r = self.reservation
            why = ("has no estimated run time" if runtime(job) is None
                   else f"would run {duration(runtime(job))}, past that")
            message = (f"It fits only on GPUs held for job {r.job_id}, ahead of it in the queue, which starts in "
                       f"{duration(r.start - self.now)}; this job {why}.")
        elif self._fits(cls.initial, mode, want, limit):
            reason = PRIORITY
            message = f"Jobs ahead of it in the queue took the free GPUs it could have used in this cycle; it {shape}."
        else:
            reason = RESOURCES
            message = f"It {shape}; {self._room_now(cls, mode)}."
        if self.reservation is None and not self.reservation_tried and job.task_class not in self.leftover_classes:
            r = self._reserve(job, cls, mode, want)
            if r is not None:
                expected = r.start
                leaves = ", ".join(self.fab.group_label(g) for g in
                                   sorted({self.fab.host_group[self.fab.gpu_host[i]] for i in r.gpu_ids}))
                message += (f" Expected to start in {duration(r.start - self.now)}, when running jobs end; "
                            f"{want} GPUs on {leaves} are reserved for it.")
        return pending(reason, message, expected_start=expected)

    # -- placement helpers -----------------------------------------------------------------
    def _active_limit(self, job: Job, at: float | None = None) -> int | None:
        topo = job.topology
        if topo is None:
            return None
        if topo.hard or (at if at is not None else self.now) < job.submit_time + topo.max_wait_s:
            return topo.max_leaves
        return None

    def _try(self, cls: _Class, mode: str, n: int, limit, held: bool, latency: bool = False):
        # The shortcut is only kept for jobs without a leaf limit (rare jobs with one are tried).
        key = (mode, held)
        if limit is None and n >= cls.failed.get(key, INF):
            return None, None
        gpus, k = choose(cls.idx, mode, n, limit, latency=latency)
        if gpus is None and limit is None:
            cls.failed[key] = min(cls.failed.get(key, INF), n)
        return gpus, k

    def _fits(self, cap, mode, n, limit) -> bool:
        k = self._fewest_leaves(cap, mode, n)
        return k is not None and (limit is None or k <= limit)

    @staticmethod
    def _fewest_leaves(cap, mode, n) -> int | None:
        if mode == SINGLE:
            return 1 if n <= cap.max_host else None
        return cap.leaves(mode == WHOLE).min_leaves(n)

    def _fits_with_held(self, cls, mode, n, limit) -> bool:
        key = (mode, "held-check")
        if limit is None and n >= cls.failed.get(key, INF):
            return False
        self._release_held()
        idx = cls.idx
        if mode == SINGLE:
            ok = idx.max_host_free() >= n
        else:
            k = idx.leaves(mode == WHOLE).min_leaves(n)
            ok = k is not None and (limit is None or k <= limit)
        self._hold_again()
        if not ok and limit is None:
            cls.failed[key] = min(cls.failed.get(key, INF), n)
        return ok

    def _ends_before_reservation(self, job: Job) -> bool:
        rt = runtime(job)
        return rt is not None and self.now + rt <= self.reservation.start

    def _release_held(self) -> None:
        self._give(self.held)

    def _hold_again(self) -> None:
        self.held = self.held & self.free
        self._take(self.held)

    def _placed(self, rank, job, cls, mode, gpus, limit) -> Decision:
        fab = self.fab
        # Lower bound before taking: the fewest leaves any placement could use now.
        if mode == SINGLE:
            bound = 1
        elif mode == PARTIAL:  # a non-gang job may also use leaves cut off from the spines
            bound = Leaves(cls.idx.gfree, [0.0] * fab.ngroups).min_leaves(len(gpus)) or 1
        else:
            bound = cls.idx.leaves(False).min_leaves(len(gpus)) or 1
        self._take(gpus)
        free = self.free
        info = describe(fab, gpus, lambda h: sum(1 for g in fab.host_gpus[h] if g.id in free))
        key = (job.tenant, job.pool)
        q = self.quota(job.tenant, job.pool)
        used = self.used.get(key, 0)
        borrowed = math.ceil(self._borrowed(job, used, len(gpus)))  # whole GPUs, even beside shares
        self.used[key] = used + len(gpus)
        self._drop_demand(job)
        rt = runtime(job)
        if rt is not None:
            self.releases.append((self.now + rt, tuple(gpus)))
        cost = Cost(hosts=len(info["hosts"]), leaves=len(info["groups"]), pod_crossings=len(info["pods"]) - 1,
                    health_penalty=info["health_penalty"], fragmentation_left=info["fragmentation_left"])
        partial = len(gpus) < job.gpus
        message = self._why_here(job, mode, gpus, info, cost, bound, limit, partial)
        if borrowed:
            message += (f" {borrowed} of its GPUs are borrowed beyond tenant {job.tenant}'s guarantee of "
                        f"{q.guaranteed} and may be reclaimed.")
        return Decision(job_id=job.id, rank=rank, placed=True, message=message, gpu_ids=tuple(gpus),
                        host_ids=tuple(fab.host_ids[h] for h in info["hosts"]), leaves=info["leaf_ids"],
                        pods=info["pod_ids"], leaves_lower_bound=bound, cost=cost, borrowed=bool(borrowed),
                        borrowed_gpus=borrowed, partial=partial)

    def _reserve(self, job: Job, cls: _Class, mode: str, n: int) -> Reservation | None:
        """Earliest start and the GPUs for the first job that must wait; hold those free now."""
        self.reservation_tried = True
        events: dict[float, list] = {}
        for end, gpu_ids in self.releases:
            events.setdefault(end, []).extend(gpu_ids)
        if job.topology is not None and not job.topology.hard:
            events.setdefault(max(self.now, job.submit_time + job.topology.max_wait_s), [])
        future = FreeIndex(self.fab, cls.elig, self.free)
        for t in sorted(events):
            future.give(events[t])
            limit = self._active_limit(job, at=t)
            gpus, _ = choose(future, mode, n, limit)
            if gpus is not None:
                break
        else:
            return None
        self.reservation = Reservation(job_id=job.id, start=t, gpu_ids=tuple(gpus))
        self.held = {i for i in gpus if i in self.free}
        self._take(self.held)
        return self.reservation

    # -- words -------------------------------------------------------------------------------
    def _shape(self, n: int, mode: str) -> str:
        if mode == SINGLE:
            return f"needs {n} GPUs on one host"
        if mode == WHOLE:
            return f"needs {n} GPUs on wholly free hosts"
        return f"needs {n} GPUs"

    def _room_now(self, cls: _Class, mode: str) -> str:
        idx = cls.idx
        if mode == SINGLE:
            return f"the most free on any matching host is {idx.max_host_free()}"
        if mode == WHOLE:
            return f"matching wholly free hosts hold {sum(idx.gwhole)} GPUs"
        return f"{idx.total_free} matching GPUs are free"

    def _describe_constraints(self, job: Job) -> str:
        c = job.constraints
        parts = []
        if c.models:
            parts.append("model " + " or ".join(sorted(c.models)))
        if c.min_memory_mib:
            parts.append(f"at least {c.min_memory_mib} MiB")
        if c.fp64:
            parts.append(f"FP64 class {c.fp64}")
        if c.site is not None:
            parts.append(f"site {c.site}")
        return ", ".join(parts) or "its request"

    def _never_message(self, job, cls, mode, n, reason, k) -> str:
        pool = job.pool
        topo = job.topology
        where = "healthy " if reason == UNHEALTHY_HOSTS else ""
        cap = cls.healthy if reason == UNHEALTHY_HOSTS else cls.ever
        if k is not None:  # fits, but not within its hard leaf limit
            return (f"topology: needs ≤ {topo.max_leaves} leaves, but even with every {where}matching GPU free "
                    f"it needs {k}.")
        if mode == SINGLE:
            return (f"It needs {n} GPUs on one host; the largest {where}host matching "
                    f"{self._describe_constraints(job)} in pool {pool} has {cap.max_host}.")
        total = cap.leaves(mode == WHOLE).total if mode != SINGLE else 0
        if reason == UNHEALTHY_HOSTS:
            return (f"It needs {n} GPUs; only {total} matching GPUs in pool {pool} are on healthy hosts and leaves "
                    f"({cls.ever.leaves(mode == WHOLE).total} in all).")
        return f"It needs {n} GPUs; pool {pool} has only {total} GPUs matching {self._describe_constraints(job)}."

    def _why_here(self, job, mode, gpus, info, cost, bound, limit, partial) -> str:
        fab = self.fab
        hosts = [fab.host_name[h] for h in info["hosts"]]
        leaves = [fab.group_label(g) for g in info["groups"]]
        if partial:
            text = (f"Started on {len(gpus)} of its {job.gpus} GPUs (not a gang job) on {_plural(len(hosts), 'host')}, "
                    "filling partly used hosts first.")
        elif mode == SINGLE:
            left = cost.fragmentation_left
            if left:
                text = (f"Placed on {hosts[0]} ({leaves[0]}): the tightest host with room, leaving "
                        f"{_plural(left, 'GPU')} free there, so whole hosts stay whole.")
            else:
                text = f"Placed on {hosts[0]} ({leaves[0]}), which it fills exactly."
        elif cost.leaves == 1:
            kind = "wholly free hosts" if mode == WHOLE else "hosts"
            text = (f"Placed on {_plural(cost.hosts, 'host')} under one leaf switch ({leaves[0]}): "
                    f"the smallest leaf with {len(gpus)} GPUs free on {kind}.")
        else:
            pods = "one pod" if cost.pod_crossings == 0 else f"{cost.pod_crossings + 1} pods"
            kind = "wholly free hosts" if mode == WHOLE else "free GPUs"
            text = (f"Placed on {_plural(cost.hosts, 'host')} across {cost.leaves} leaf switches "
                    f"({', '.join(leaves)}) in {pods}: no leaf has {len(gpus)} GPUs on {kind} now, and "
                    f"{cost.leaves} is the fewest leaves that do")
            text += f" (lower bound {bound})." if bound == cost.leaves else \
                f"; counting partly used hosts too, {bound} could."
        if cost.health_penalty > 0:
            text += f" Its leaves carry a health penalty of {cost.health_penalty:g}: no healthier room was as good."
        elif job.task_class in self.latency_classes and not partial:
            text += f" As a latency-sensitive {job.task_class} job it went to a healthy, lightly loaded leaf."
        topo = job.topology
        if topo is not None and limit is None and not topo.hard and cost.leaves > topo.max_leaves:
            text += (f" Its soft limit of {topo.max_leaves} leaves was dropped after waiting "
                     f"{duration(topo.max_wait_s)}.")
        return text
