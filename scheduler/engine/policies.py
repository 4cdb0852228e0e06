"""Policies that run after the plain cycle (plan.plan calls `apply`): preemption, remote
sites and rebalancing. They only add proposals; nothing the plain cycle placed changes.

Preemption / reclaim. A job the cycle left waiting for room (resources, priority, reserved)
may take GPUs from running preemptible work on borrowed quota, when it has a higher priority
than the victim, or when its tenant stays within its guarantee and the victim is another
tenant's. Victims are considered lowest priority first, then youngest. The victims are chosen
for a good placement, not merely enough GPUs: first every candidate is freed and the best
placement found (fewest leaves, as for any job); then candidates are dropped, the least
preferred victims first (highest priority, oldest), as long as the job still fits on no more
leaves; the victims are those whose GPUs the final placement uses. Its decision has kind
"preemption", the victims' job ids and `gains` (GPU ids, GPUs freed, leaves, victims).

Remote sites. A job with a home site (constraints.site) that allows remote placement and has
waited `remote_after_s` without a placement may be proposed at another site of its pool, the
whole gang at one site (the placement runs with the constraint set to that site). The site
with the best cost wins, then the lowest link latency. Kind "remote", with the link's latency
and bandwidth in `gains`.

Rebalancing (Plan.moves, for restartable running jobs; an operator accepts):
* idle: every GPU of the job has been idle for longer than the threshold;
* fragmentation: a blocked job needs one whole host and a host is held only by small
  restartable jobs that fit elsewhere: moving them frees the host.
"""
from __future__ import annotations

from dataclasses import replace

from .index import FreeIndex
from .model import (CONSTRAINTS, PREEMPTION, PRIORITY, REMOTE, RESERVED, RESOURCES, TOPOLOGY_WAIT, UNHEALTHY_HOSTS,
                    ClassRule, Cost, Decision, Move, Running)
from .placement import LOOSE, SINGLE, WHOLE, choose, describe

BLOCKED = (RESOURCES, PRIORITY, RESERVED)  # waits for room that preemption could give
MAX_PREEMPTORS = 16  # blocked jobs tried per cycle (each costs a few index updates per candidate)
MAX_CANDIDATES = 64  # victims considered per blocked job
MAX_MOVES = 8  # rebalancing proposals per cycle
NO_RULE = ClassRule()


def apply(cycle, plan) -> None:
    """Cheap when nothing applies (no candidates: a scan of the running list and the queue)."""
    snap = cycle.snap
    preempt = any(r.preemptible and r.borrowed for r in snap.running)
    remote = any(j.allow_remote_site for j in cycle.jobs)
    rebalance = bool(snap.gpu_idle_s) or any(r.restartable for r in snap.running)
    if not (preempt or remote or rebalance):
        return
    jobs = {j.id: j for j in cycle.jobs}
    if preempt:
        _preempt(cycle, plan, jobs)
    if remote:
        _remote(cycle, plan, jobs)
    if rebalance:
        plan.moves = _rebalance(cycle, plan, jobs)


def _mode(cls, job) -> str:
    return SINGLE if job.gpus <= cls.host_max else (WHOLE if job.whole_hosts else LOOSE)


def _cost(cycle, gpus) -> tuple[Cost, dict]:
    fab, free = cycle.fab, cycle.free
    info = describe(fab, gpus, lambda h: sum(1 for g in fab.host_gpus[h] if g.id in free and g.id not in gpus))
    return Cost(hosts=len(info["hosts"]), leaves=len(info["groups"]), pod_crossings=len(info["pods"]) - 1,
                health_penalty=info["health_penalty"], fragmentation_left=info["fragmentation_left"]), info


def _replace(plan, old: Decision, new: Decision) -> None:
    plan.decisions[plan.decisions.index(old)] = new


# -- preemption ----------------------------------------------------------------------------------

def _preempt(cycle, plan, jobs) -> None:
    snap = cycle.snap
    fab = cycle.fab
    taken: set = set()  # victims already given to an earlier job in this cycle
    tried = 0
    for d in list(plan.decisions):
        if d.placed or d.reason not in BLOCKED:
            continue
        job = jobs[d.job_id]
        if cycle.rule(job).leftovers_only or not isinstance(job.gpus, int):
            continue
        tried += 1
        if tried > MAX_PREEMPTORS:
            break
        q = cycle.quota(job.tenant, job.pool)
        used = cycle.used.get((job.tenant, job.pool), 0)
        if q.limit is not None and used + job.gpus > q.limit:
            continue
        within_guarantee = used + job.gpus <= q.guaranteed

        def may_take(r: Running) -> bool:
            if r.job_id in taken or not (r.preemptible and r.borrowed) or r.start is None or r.pool != job.pool:
                return False
            if not snap.class_rules.get(r.task_class, NO_RULE).preemptible:
                return False  # latency-sensitive classes are never preempted
            return r.priority < job.priority or (within_guarantee and r.tenant != job.tenant)

        cands = sorted((r for r in snap.running if may_take(r)), key=lambda r: (r.priority, -r.start, repr(r.job_id)))
        cands = cands[:MAX_CANDIDATES]
        if not cands:
            continue
        cls = cycle.class_for(job)
        if cls.host_max == 0:
            continue
        mode = _mode(cls, job)
        limit = cycle._active_limit(job)
        extra = set(cycle.held) if plan.reservation is not None and plan.reservation.job_id == job.id else set()
        idx = FreeIndex(fab, cls.elig, cycle.free | extra | {g for r in cands for g in r.gpu_ids})
        best, _ = choose(idx, mode, job.gpus, limit)
        if best is None:
            continue
        best_leaves = len({fab.host_group[fab.gpu_host[g]] for g in best})
        kept = list(cands)
        # Drop the least preferred victims first while the job still fits as well.
        for r in reversed(cands):
            idx.take(r.gpu_ids)
            gpus, _ = choose(idx, mode, job.gpus, limit)
            if gpus is not None and len({fab.host_group[fab.gpu_host[g]] for g in gpus}) <= best_leaves:
                kept.remove(r)
                best = gpus
            else:
                idx.give(r.gpu_ids)
        gpus, _ = choose(idx, mode, job.gpus, limit)
        chosen = set(gpus)
        victims = [r for r in kept if chosen.intersection(r.gpu_ids)]
        if not victims:
            continue  # it fits without anyone stopping (e.g. the reservation's GPUs): the plan waits
        taken.update(r.job_id for r in victims)
        _take_for(cycle, job, gpus)
        for r in victims:
            key = (r.tenant, r.pool)
            cycle.used[key] = cycle.used.get(key, 0) - len(r.gpu_ids)
        cost, info = _cost(cycle, gpus)
        freed = sum(len(r.gpu_ids) for r in victims)
        names = ", ".join(f"job {r.job_id} ({len(r.gpu_ids)} GPUs, priority {r.priority})" for r in victims)
        why = (f"its priority {job.priority} is above theirs" if all(r.priority < job.priority for r in victims)
               else f"tenant {job.tenant} is within its guarantee of {q.guaranteed} GPUs")
        message = (f"Preempts {names}, running on borrowed quota: {why}. Their {freed} GPUs give it "
                   f"{job.gpus} GPUs on {cost.hosts} host{'s' if cost.hosts != 1 else ''} and {cost.leaves} "
                   f"leaf switch{'es' if cost.leaves != 1 else ''}; they go back to the queue after their grace "
                   "period.")
        gains = {"gpu_ids": list(gpus), "gpus_freed": freed, "leaves": cost.leaves, "hosts": cost.hosts,
                 "victims": [{"job": r.job_id, "tenant": r.tenant, "gpus": len(r.gpu_ids), "priority": r.priority,
                              "placement": r.placement} for r in victims]}
        if d.expected_start is not None:
            gains["starts_sooner_s"] = round(d.expected_start - cycle.now)
        _replace(plan, d, Decision(
            job_id=job.id, rank=d.rank, placed=True, message=message, gpu_ids=tuple(gpus),
            host_ids=tuple(fab.host_ids[h] for h in info["hosts"]), leaves=info["leaf_ids"], pods=info["pod_ids"],
            leaves_lower_bound=best_leaves, cost=cost, borrowed=bool(cycle._borrowed(job, used, job.gpus)),
            borrowed_gpus=cycle._borrowed(job, used, job.gpus), kind=PREEMPTION,
            victims=tuple(r.job_id for r in victims), gains=gains))


def _take_for(cycle, job, gpus) -> None:
    """Book the job's GPUs in the cycle (those free now leave the indexes) and its quota."""
    free_now = [g for g in gpus if g in cycle.free]
    if free_now:
        cycle._take(free_now)
    cycle.held.difference_update(gpus)
    key = (job.tenant, job.pool)
    cycle.used[key] = cycle.used.get(key, 0) + len(gpus)
    cycle._drop_demand(job)


# -- remote sites --------------------------------------------------------------------------------

def _remote(cycle, plan, jobs) -> None:
    snap, fab = cycle.snap, cycle.fab
    for d in list(plan.decisions):
        if d.placed or d.reason not in (RESOURCES, PRIORITY, RESERVED, TOPOLOGY_WAIT, UNHEALTHY_HOSTS, CONSTRAINTS):
            continue
        job = jobs[d.job_id]
        home = job.constraints.site
        if not (job.allow_remote_site and home) or cycle.now - job.submit_time < job.remote_after_s:
            continue
        if not isinstance(job.gpus, int) or job.gpus < 1:
            continue
        q = cycle.quota(job.tenant, job.pool)
        used = cycle.used.get((job.tenant, job.pool), 0)
        if q.limit is not None and used + job.gpus > q.limit:
            continue
        sites = sorted({fab.host_site[h] for h in fab.pool_hosts.get(job.pool, ())} - {home, ""})
        best = None
        for site in sites:
            link = snap.site_links.get(frozenset((home, site)))
            if link is not None and not link.healthy:
                continue
            away = replace(job, constraints=replace(job.constraints, site=site))
            cls = cycle.class_for(away)
            if cls.host_max == 0:
                continue
            # One site per job: the gang is never split (the class holds only this site's GPUs).
            gpus, _ = choose(cls.idx, _mode(cls, away), job.gpus, cycle._active_limit(job))
            if gpus is None:
                continue
            cost, info = _cost(cycle, gpus)
            key = (cost.key(), link.latency_ms if link else float("inf"), site)
            if best is None or key < best[0]:
                best = (key, site, link, gpus, cost, info)
        if best is None:
            continue
        _, site, link, gpus, cost, info = best
        borrowed = cycle._borrowed(job, used, job.gpus)
        _take_for(cycle, job, gpus)
        waited = cycle.now - job.submit_time
        if link is not None:
            over = f"over a {link.latency_ms:g} ms, {link.bandwidth_gbps:g} Gb/s link from {home}"
        else:
            over = f"(no inter-site link from {home} is recorded: latency and bandwidth unknown)"
        message = (f"It could not start at its home site {home} within {round(waited)} s; proposed at site {site} "
                   f"{over}: {job.gpus} GPUs on {cost.hosts} host{'s' if cost.hosts != 1 else ''} and {cost.leaves} "
                   f"leaf switch{'es' if cost.leaves != 1 else ''}, the whole job at one site.")
        gains = {"home_site": home, "site": site, "waited_s": round(waited),
                 "latency_ms": link.latency_ms if link else None,
                 "bandwidth_gbps": link.bandwidth_gbps if link else None, "leaves": cost.leaves}
        _replace(plan, d, Decision(
            job_id=job.id, rank=d.rank, placed=True, message=message, gpu_ids=tuple(gpus),
            host_ids=tuple(fab.host_ids[h] for h in info["hosts"]), leaves=info["leaf_ids"], pods=info["pod_ids"],
            leaves_lower_bound=cost.leaves, cost=cost, borrowed=bool(borrowed), borrowed_gpus=borrowed,
            kind=REMOTE, site=site, gains=gains))


# -- rebalancing ---------------------------------------------------------------------------------

def _rebalance(cycle, plan, jobs) -> list[Move]:
    snap, fab = cycle.snap, cycle.fab
    moves: list[Move] = []
    moving: set = set()
    from .plan import duration

    # 1. Allocated GPUs idle too long.
    idle_of = snap.gpu_idle_s
    threshold = snap.idle_threshold_s
    waiting = sum(1 for d in plan.decisions if not d.placed)
    for r in snap.running:
        if len(moves) >= MAX_MOVES:
            return moves
        if not r.restartable or r.start is None or not r.gpu_ids:
            continue
        idle = min(idle_of.get(g, 0.0) for g in r.gpu_ids)
        if idle < threshold:
            continue
        moving.add(r.job_id)
        moves.append(Move(
            job_id=r.job_id, placement=r.placement, from_gpus=tuple(r.gpu_ids), to_gpus=(), why="idle",
            message=(f"Its {len(r.gpu_ids)} GPUs have been idle for {duration(idle)} (threshold "
                     f"{duration(threshold)}): stopping it and requeueing it frees them"
                     + (f" for the {waiting} waiting jobs." if waiting else ".")),
            gains={"idle_gpus": len(r.gpu_ids), "idle_s": round(idle), "waiting_jobs": waiting}))

    # 2. Small restartable jobs fragmenting a host a blocked job needs whole.
    free = cycle.free
    host_free = [sum(1 for g in fab.host_gpus[h] if g.id in free) for h in range(len(fab.host_ids))]
    promised: set = set()  # target GPUs of earlier moves
    on_host: dict[int, list[Running]] = {}
    for r in snap.running:
        hosts = {fab.gpu_host[g] for g in r.gpu_ids}
        for h in hosts:
            on_host.setdefault(h, []).append(r)
    for d in plan.decisions:
        if len(moves) >= MAX_MOVES:
            break
        if d.placed or d.reason not in (RESOURCES, PRIORITY):
            continue
        job = jobs[d.job_id]
        cls = cycle.class_for(job)
        if not isinstance(job.gpus, int) or cls.host_max == 0 or job.gpus > cls.host_max:
            continue  # only single-host jobs here: one freed host is what they need
        for h in sorted(cls.elig, key=lambda h: (-host_free[h], h)):
            size = len(cls.elig[h])
            if size < job.gpus or host_free[h] >= job.gpus:
                continue
            residents = on_host.get(h, [])
            if not residents or any(not r.restartable or r.job_id in moving or len({fab.gpu_host[g] for g in
                                    r.gpu_ids}) > 1 for r in residents):
                continue
            if host_free[h] + sum(len(r.gpu_ids) for r in residents) < job.gpus:
                continue
            # Each resident goes to the tightest other host with room (not this one).
            spare = list(host_free)
            targets = []
            for r in sorted(residents, key=lambda r: -len(r.gpu_ids)):
                n = len(r.gpu_ids)
                pool_hosts = [x for x in fab.pool_hosts.get(r.pool, ()) if x != h and spare[x] >= n
                              and fab.host_healthy[x]]
                if not pool_hosts:
                    break
                x = min(pool_hosts, key=lambda x: (spare[x], x))
                to = tuple(g.id for g in fab.host_gpus[x] if g.id in free and g.id not in promised)[:n]
                promised.update(to)
                spare[x] -= n
                targets.append((r, x, to))
            else:
                for r, x, to in targets:
                    moving.add(r.job_id)
                    moves.append(Move(
                        job_id=r.job_id, placement=r.placement, from_gpus=tuple(r.gpu_ids), to_gpus=to,
                        why="fragmentation",
                        message=(f"Moving it from {fab.host_name[h]} to {fab.host_name[x]} frees {fab.host_name[h]} "
                                 f"whole for job {job.id}, which needs {job.gpus} GPUs on one host."),
                        gains={"host_freed": fab.host_name[h], "for_job": job.id, "gpus_for_job": job.gpus,
                               "to_host": fab.host_name[x]}))
                host_free = spare
                break
    return moves
