"""The database as the engine sees it: one `engine.Snapshot` built in a fixed number of
queries (about a dozen, whatever the cluster size), plus what the cycle needs to persist
the plan (policies, the pending jobs' current reasons, tenant and pool ids).

What counts:
* Hosts: those in a pool running the FabricPool agent (exporters only report telemetry),
  plus any host still holding an active placement. A host is healthy when it is up;
  stale, unreachable, down or new hosts are unhealthy. A draining host is healthy but
  offers nothing: its GPUs are not free (jobs wait for room, not for health).
* GPUs: present GPUs of those hosts, free when their host offers GPUs and no active
  placement holds them. A GPU no longer reported but still in an active placement is
  kept (taken, unhealthy) so the engine knows who holds it.
* Leaves: the switches the hosts' adapters are cabled to; on a rail-optimized host one
  per rail. A leaf's health penalty is the share of its uplinks that are broken (down or
  missing count 1, degraded 0.5); 1 means cut off from the spines.
* Pods: leaves joined through spines (switch-switch links that touch no core switch);
  a 2-tier fabric is one pod.
* Running: every active placement (proposed, approved, dispatching, running) with its
  expected end: started_at (or now, not started yet) + estimated run time (else maximum).
  A running placement is a preemption candidate when its job is preemptible, it was
  borrowed and no stop was requested. An approved or proposed preemption that has not yet
  got its GPUs (its victims still stop) holds those of its GPUs nobody else holds.
* Policies: task class rules (TaskClassRule rows over settings SCHEDULER_TASK_CLASSES),
  inter-site links, and for restartable running jobs how long their GPUs have been idle
  (1-minute rollups below REBALANCE_IDLE_UTILIZATION since the placement started).
* GPUs that agents report busy with work the scheduler does not know (pool.Gpu
  .foreign_busy_until, set by scheduler.reconcile) are not free.
* Queue: pending and preempted jobs, except those whose dispatch failed less than
  DISPATCH_FAILED_BACKOFF_S ago (their pending reason says when they are tried again).
  Engine ids: job and GPU primary keys; pools and tenants by name (the engine's sentences
  name them).
Hosts, GPUs and jobs come in primary-key order, so that the engine's ties break the same
way every time; other queries skip the models' default ordering (sorts and joins it would cost).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from fabric.fattree import natural_key
from fabric.models import InterSiteLink, Link, Switch
from pool.models import Gpu, GpuRollup, Host, Resolution

from . import engine
from .engine.sharing import quota_share
from .dispatch import DISPATCH_FAILED
from .models import Job, Placement, PlacementGpu, PoolPolicy, TaskClassRule, Tenant, TenantQuota

QUEUED_STATES = (Job.State.PENDING, Job.State.PREEMPTED)
LINK_WEIGHT = {Link.State.UP: 0.0, Link.State.DEGRADED: 0.5, Link.State.DOWN: 1.0, Link.State.MISSING: 1.0}


@dataclass
class PendingRow:
    """What the queue row says now (the cycle writes only what changed)."""
    state: str
    reason: str
    message: str
    expected_start: datetime | None
    tenant_id: int
    pool_id: int
    gpus: int


@dataclass
class Taken:
    """The cycle's view of the world: the snapshot and what persisting needs."""
    snapshot: engine.Snapshot
    now: datetime
    pending: dict[int, PendingRow] = field(default_factory=dict)  # job id -> row
    policies: dict[int, PoolPolicy] = field(default_factory=dict)  # pool id -> policy (absent: auto)
    pool_ids: dict[str, int] = field(default_factory=dict)
    gpus_total: int = 0
    gpus_free: int = 0
    # GPUs in running placements; a fractional one counts as its share (float)
    running_gpus_by_tenant: dict[int, float] = field(default_factory=dict)
    queries: int = 0


def usage_now(usage: float, updated_at: datetime | None, now: datetime) -> float:
    """Decayed usage at `now` (half-life USAGE_HALF_LIFE_HOURS)."""
    if not usage or updated_at is None:
        return usage or 0.0
    half_life = float(settings.USAGE_HALF_LIFE_HOURS) * 3600
    dt = max(0.0, (now - updated_at).total_seconds())
    return usage * math.pow(0.5, dt / half_life) if half_life > 0 else 0.0


def runtime_of(estimated, maximum) -> float | None:
    return float(estimated) if estimated else (float(maximum) if maximum else None)


def engine_job(job_id, tenant, pool, gpus, gpu_models, min_memory_mib, fp64, site, task_class, priority, gang,
               whole_hosts, estimated, maximum, max_leaves, hard, max_wait, created_at,
               allow_remote_site=False) -> engine.Job:
    topology = None
    if max_leaves:
        topology = engine.TopologyRequirement(max_leaves=max_leaves, hard=hard, max_wait_s=float(max_wait or 0))
    constraints = engine.Constraints(models=frozenset(m for m in (gpu_models or []) if isinstance(m, str) and m),
                                     min_memory_mib=min_memory_mib or 0, fp64=fp64 or None, site=site or None)
    return engine.Job(id=job_id, tenant=tenant, pool=pool, gpus=gpus, constraints=constraints, task_class=task_class,
                      priority=priority, submit_time=created_at.timestamp(), gang=gang,
                      estimated_runtime=float(estimated) if estimated else None,
                      max_runtime=float(maximum) if maximum else None, topology=topology, whole_hosts=whole_hosts,
                      # Its wait (max_wait_s) is also how long it waits at home before another site.
                      allow_remote_site=bool(allow_remote_site and site), remote_after_s=float(max_wait or 0))


def job_for_engine(job: Job) -> engine.Job:
    """One Job row as the engine sees it (overrides validate with it)."""
    return engine_job(job.pk, job.tenant.name, job.pool.name, job.gpus, job.gpu_models, job.min_memory_mib, job.fp64,
                      job.site, job.task_class, job.priority, job.gang, job.whole_hosts, job.estimated_runtime_s,
                      job.max_runtime_s, job.max_leaves, job.topology_hard, job.max_wait_s, job.created_at,
                      job.allow_remote_site)


def take(now: datetime | None = None, *, with_queue: bool = True) -> Taken:
    now = now or timezone.now()
    t = now.timestamp()
    queries = 0

    # Active placements and their GPUs.
    placements = list(Placement.objects.filter(state__in=Placement.ACTIVE_STATES).order_by().values_list(
        "id", "job_id", "state", "started_at", "stop_requested_at", "job__tenant_id", "job__pool_id",
        "job__estimated_runtime_s", "job__max_runtime_s", "job__preemptible", "kind", "borrowed", "job__priority",
        "job__task_class", "job__restartable", "gains"))
    held = list(PlacementGpu.objects.filter(active=True).order_by().values_list("placement_id", "gpu_id", "gpu__host_id"))
    queries += 2
    gpus_of: dict[int, list[int]] = {}
    for pid, gid, _ in held:
        gpus_of.setdefault(pid, []).append(gid)
    held_gpus = {gid for _, gid, _ in held}
    held_hosts = {hid for _, _, hid in held}
    # sharing: GPUs partly held by fractional placements (share < 1000): share, memory, MIG slices.
    shared_use: dict[int, list[int]] = {}
    shared_placements: dict = {}  # placement id -> its share of a GPU, for quotas
    for pid, gid, milli, mem, mig in PlacementGpu.objects.filter(active=True, share_milli__lt=1000).order_by(
            ).values_list("placement_id", "gpu_id", "share_milli", "memory_mib", "mig_device"):
        use = shared_use.setdefault(gid, [0, 0, 0])
        use[0] += milli
        use[1] += mem
        use[2] += int(mig.split("g.", 1)[0]) if mig[:1].isdigit() else 0
        shared_placements[pid] = quota_share(milli, mig.split("@", 1)[0] if mig[:1].isdigit() else "")
    queries += 1
    # sharing: end

    pooled = Q(pool__isnull=False, agent_kind=Host.AgentKind.FABRICPOOL)
    host_fields = ("id", "name", "pool_id", "pool__name", "site__name", "state", "fabric_id")
    host_rows = list(Host.objects.filter(pooled).order_by("id").values_list(*host_fields))
    gpu_fields = ("id", "host_id", "index", "model", "memory_mib", "fp64_class", "present", "foreign_busy_until")
    gpu_rows = [row for row in Gpu.objects.filter(host__pool__isnull=False, host__agent_kind=Host.AgentKind.FABRICPOOL)
                .order_by("id").values_list(*gpu_fields)
                if row[6] or row[0] in held_gpus]
    queries += 2
    known_hosts = {row[0] for row in host_rows}
    known_gpus = {row[0] for row in gpu_rows}
    # Rare: placements on hosts that left their pool or agent, or on GPUs no longer reported.
    extra_hosts = held_hosts - known_hosts
    if extra_hosts:
        host_rows += list(Host.objects.filter(id__in=extra_hosts).order_by().values_list(*host_fields))
        queries += 1
    missing_gpus = held_gpus - known_gpus
    if missing_gpus:
        gpu_rows += list(Gpu.objects.filter(id__in=missing_gpus).order_by().values_list(*gpu_fields))
        queries += 1

    host_ids = [row[0] for row in host_rows]
    fabric_ids = {row[6] for row in host_rows if row[6] is not None}
    host_leaves, leaves, pods, q = _fabric(host_ids, fabric_ids)
    queries += q

    hosts, offering = [], set()
    pool_ids = {}
    for hid, name, pool_id, pool_name, site, state, _ in host_rows:
        if pool_name is not None:
            pool_ids[pool_name] = pool_id
        healthy = state in (Host.State.UP, Host.State.DRAINING) and hid not in extra_hosts
        if state == Host.State.UP and hid not in extra_hosts:
            offering.add(hid)
        hosts.append(engine.Host(id=hid, name=name, leaves=tuple(host_leaves.get(hid, ())), pool=pool_name,
                                 site=site or "", healthy=healthy))
    gpus = []
    free_count = 0
    for gid, hid, index, model, memory, fp64, present, foreign_until in gpu_rows:
        foreign = foreign_until is not None and foreign_until > now  # work we do not know uses it
        free = present and hid in offering and gid not in held_gpus and not foreign
        free_count += free
        use = shared_use.get(gid, (0, 0, 0))  # sharing: a partly shared GPU says what is taken
        gpus.append(engine.Gpu(id=gid, host=hid, index=index, model=model, memory_mib=memory, fp64=fp64, free=free,
                               healthy=bool(present), used_milli=use[0], used_memory_mib=use[1], mig_slices=use[2]))

    # Names for the engine's ids.
    tenant_rows = list(Tenant.objects.order_by().values_list("id", "name", "usage_gpu_seconds", "usage_updated_at"))
    queries += 1
    tenant_name = {tid: name for tid, name, _, _ in tenant_rows}
    pool_name_of = {pid: name for name, pid in pool_ids.items()}

    running = []
    running_by_tenant: dict[int, int] = {}
    restartable = []
    for (pid, job_id, state, started_at, stop_at, tenant_id, pool_id, est, mx, preemptible, kind, borrowed, priority,
         task_class, restart, gains) in placements:
        ids = tuple(gpus_of.get(pid, ()))
        if pid in shared_placements:
            # sharing: fractional, not whole GPUs (its Gpu carries its share, above); it holds no
            # GPU of its own but counts its share against its tenant's quota and usage.
            share = shared_placements[pid]
            running.append(engine.Running(job_id=job_id, gpu_ids=(), tenant=tenant_name.get(tenant_id),
                                          pool=pool_name_of.get(pool_id), priority=priority, borrowed=borrowed,
                                          task_class=task_class, placement=pid, share=share))
            if state == Placement.State.RUNNING:
                running_by_tenant[tenant_id] = running_by_tenant.get(tenant_id, 0) + float(share)
            continue
        if not ids and kind == Placement.Kind.PREEMPTION:
            # Waiting for its victims: it holds what they have already freed.
            ids = tuple(g for g in (gains or {}).get("gpu_ids", ()) if g not in held_gpus and g in known_gpus)
            held_gpus.update(ids)
        if not ids:
            continue
        rt = runtime_of(est, mx)
        if stop_at is not None:
            end = t
        elif rt is None:
            end = None
        else:
            end = (started_at.timestamp() if started_at else t) + rt
        is_running = state == Placement.State.RUNNING and stop_at is None
        running.append(engine.Running(job_id=job_id, gpu_ids=ids, tenant=tenant_name.get(tenant_id),
                                      pool=pool_name_of.get(pool_id), expected_end=end,
                                      preemptible=preemptible and is_running, priority=priority, borrowed=borrowed,
                                      start=started_at.timestamp() if is_running and started_at else None,
                                      task_class=task_class, restartable=restart and is_running, placement=pid))
        if restart and is_running and started_at:
            restartable.append((ids, started_at))
        if state == Placement.State.RUNNING:
            running_by_tenant[tenant_id] = running_by_tenant.get(tenant_id, 0) + len(ids)

    usage = {tid: usage_now(u, at, now) for tid, _, u, at in tenant_rows}
    quotas = {}
    for tid, pool_id, pool_name, guaranteed, limit in TenantQuota.objects.order_by().values_list(
            "tenant_id", "pool_id", "pool__name", "guaranteed_gpus", "limit_gpus"):
        quotas[(tenant_name[tid], pool_name)] = engine.Quota(guaranteed=guaranteed, limit=limit, usage=usage[tid])
        pool_ids.setdefault(pool_name, pool_id)
    queries += 1

    queue, pending = [], {}
    if with_queue:
        # A job whose dispatch just failed sits out until its retry time (expected_start), so
        # that the next cycle does not pick the same refusing GPUs again at once.
        held_back = Q(pending_reason=DISPATCH_FAILED, expected_start__gt=now)
        rows = Job.objects.filter(state__in=QUEUED_STATES).exclude(held_back).order_by("id").values_list(
            "id", "tenant_id", "pool_id", "pool__name", "gpus", "gpu_models", "min_memory_mib", "fp64", "site",
            "task_class", "priority", "gang", "whole_hosts", "estimated_runtime_s", "max_runtime_s", "max_leaves",
            "topology_hard", "max_wait_s", "created_at", "state", "pending_reason", "pending_message",
            "expected_start", "allow_remote_site")
        queries += 1
        for (jid, tid, pid, pname, n, models_, mem, fp64, site, task, prio, gang, whole, est, mx, max_leaves, hard,
             wait, created, state, reason, message, expected, remote) in rows.iterator(chunk_size=5000):
            queue.append(engine_job(jid, tenant_name[tid], pname, n, models_, mem, fp64, site, task, prio, gang, whole,
                                    est, mx, max_leaves, hard, wait, created, remote))
            pending[jid] = PendingRow(state, reason, message, expected, tid, pid, n)
            pool_ids.setdefault(pname, pid)

    # sharing: what fractional queued jobs ask for (one small query; most jobs take whole GPUs).
    if queue:
        fractions = {jid: (milli, mem, mig) for jid, milli, mem, mig in Job.objects.filter(
            state__in=QUEUED_STATES).exclude(gpu_milli=0, gpu_memory_mib=0, mig_profile="").order_by().values_list(
            "id", "gpu_milli", "gpu_memory_mib", "mig_profile")}
        queries += 1
        if fractions:
            queue = [replace(j, gpu_milli=fractions[j.id][0], gpu_memory_mib=fractions[j.id][1],
                             mig_profile=fractions[j.id][2]) if j.id in fractions else j for j in queue]
    # sharing: end
    policies = {p.pool_id: p for p in PoolPolicy.objects.select_related("pool")}
    queries += 1
    rules, links, q = policy_inputs()
    queries += q
    idle, q = idle_seconds(restartable, now)
    queries += q
    snap = engine.Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=pods, running=running, queue=queue,
                           quotas=quotas, now=t, class_rules=rules, site_links=links, gpu_idle_s=idle,
                           idle_threshold_s=float(settings.REBALANCE_IDLE_S), order=settings.SCHEDULER_QUEUE_ORDER,
                           order_max_wait_s=float(settings.SCHEDULER_ORDER_MAX_WAIT_S))
    return Taken(snapshot=snap, now=now, pending=pending, policies=policies, pool_ids=pool_ids,
                 gpus_total=len(gpus), gpus_free=free_count, running_gpus_by_tenant=running_by_tenant,
                 queries=queries)


RULE_FIELDS = ("pack_tightly", "prefer_healthy_leaves", "prefer_lightly_loaded", "preemptible", "requires_fp64",
               "leftovers_only", "whole_gpus")


def class_rules() -> dict[str, engine.ClassRule]:
    """Task class -> rule: the admin's TaskClassRule rows over settings SCHEDULER_TASK_CLASSES."""
    rules = {}
    for name, values in (getattr(settings, "SCHEDULER_TASK_CLASSES", None) or {}).items():
        unknown = set(values) - set(RULE_FIELDS)
        if unknown:
            raise ValueError(f"settings SCHEDULER_TASK_CLASSES[{name!r}]: unknown keys {sorted(unknown)}; "
                             f"allowed: {', '.join(RULE_FIELDS)}")
        rules[name] = engine.ClassRule(**values)
    for row in TaskClassRule.objects.order_by().values("task_class", *RULE_FIELDS):
        name = row.pop("task_class")
        rules[name] = engine.ClassRule(**row)
    return rules


def policy_inputs():
    """(class rules, {frozenset({site a, site b}): SiteLink}, queries)."""
    links = {frozenset((a, b)): engine.SiteLink(latency_ms=lat, bandwidth_gbps=bw, healthy=ok)
             for a, b, lat, bw, ok in InterSiteLink.objects.order_by().values_list(
                 "site_a__name", "site_b__name", "latency_ms", "bandwidth_gbps", "healthy")}
    return class_rules(), links, 2


def idle_seconds(restartable: list[tuple[tuple, datetime]], now: datetime) -> tuple[dict, int]:
    """GPU id -> seconds its utilization has stayed below REBALANCE_IDLE_UTILIZATION, for the
    GPUs of restartable running placements (from 1-minute rollups since the placement
    started). A GPU without samples since then is not called idle (no data is not idleness)."""
    if not restartable:
        return {}, 0
    since = {g: started for ids, started in restartable for g in ids}
    floor = float(settings.REBALANCE_IDLE_UTILIZATION)
    first = min(since.values())
    last_busy: dict[int, datetime] = {}
    seen: dict[int, datetime] = {}
    for gid, t, util in GpuRollup.objects.filter(gpu_id__in=list(since), resolution=Resolution.MINUTE,
                                                 t__gte=first).order_by().values_list("gpu_id", "t",
                                                                                      "utilization_max"):
        if t < since[gid]:
            continue
        seen[gid] = min(seen.get(gid, t), t)
        if util is not None and util >= floor and t > last_busy.get(gid, since[gid]):
            last_busy[gid] = t
    idle = {gid: max(0.0, (now - last_busy.get(gid, since[gid])).total_seconds()) for gid in seen}
    return idle, 1


def _fabric(host_ids, fabric_ids):
    """({host id: [leaf switch ids]}, [engine.Leaf], [engine.Pod], queries)."""
    if not host_ids:
        return {}, [], [], 0
    # The whole host-adapter table: one row per adapter, cheaper than a long IN list.
    through = Host.adapters.through.objects.order_by()
    adapter_host = {aid: hid for hid, aid in through.values_list("host_id", "channeladapter_id")}
    host_set = set(host_ids)
    cables = Link.objects.filter(kind=Link.Kind.ADAPTER_SWITCH, fabric_id__in=fabric_ids).order_by().values_list(
        "port_a__adapter_id", "port_a__switch_id", "port_b__adapter_id", "port_b__switch_id")
    host_leaves: dict[int, set] = {}
    for a_adapter, a_switch, b_adapter, b_switch in cables:
        adapter, switch = (a_adapter, b_switch) if a_adapter is not None else (b_adapter, a_switch)
        hid = adapter_host.get(adapter)
        if hid in host_set and switch is not None:
            host_leaves.setdefault(hid, set()).add(switch)
    leaf_ids = set().union(*host_leaves.values()) if host_leaves else set()

    switches = {sid: (name, tier) for sid, name, tier in
                Switch.objects.filter(fabric_id__in=fabric_ids).order_by().values_list("id", "description", "tier")}
    uplinks: dict[int, list[float]] = {sid: [] for sid in leaf_ids}
    parent = {sid: sid for sid in switches}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, state in Link.objects.filter(kind=Link.Kind.SWITCH_SWITCH, fabric_id__in=fabric_ids).order_by().values_list(
            "port_a__switch_id", "port_b__switch_id", "state"):
        if a is None or b is None:
            continue
        for end in (a, b):
            if end in uplinks:
                uplinks[end].append(LINK_WEIGHT.get(state, 1.0))
        # Pods: leaves and spines joined below the cores.
        if a in switches and b in switches and Switch.Tier.CORE not in (switches[a][1], switches[b][1]):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
    pod_members: dict[int, list[int]] = {}
    for sid in leaf_ids:
        pod_members.setdefault(find(sid) if sid in parent else sid, []).append(sid)
    pod_order = sorted(pod_members, key=lambda p: min(natural_key(_name(switches, s)) for s in pod_members[p]))
    pods = [engine.Pod(id=p, name=f"pod {i + 1}") for i, p in enumerate(pod_order)]
    pod_of = {sid: p for p, members in pod_members.items() for sid in members}
    leaves = []
    for sid in sorted(leaf_ids):
        weights = uplinks[sid]
        penalty = round(sum(weights) / len(weights), 3) if weights else 0.0
        leaves.append(engine.Leaf(id=sid, name=_name(switches, sid), pod=pod_of[sid], health_penalty=min(1.0, penalty)))
    return {h: sorted(ls) for h, ls in host_leaves.items()}, leaves, pods, 4


def _name(switches, sid) -> str:
    return switches.get(sid, (f"switch {sid}", ""))[0] or f"switch {sid}"
