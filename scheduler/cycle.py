"""One allocation cycle: expire stale proposals, snapshot the database, plan with the engine,
persist the plan.

One cycle at a time cluster-wide: a Redis lock with a TTL (CYCLE_LOCK_TTL). A worker that
dies mid-cycle never releases it; it expires and the next tick runs. A second cycle that
finds it held is skipped (the running one does the work).

Nothing half-written: the whole persist phase (proposals and their GPUs, job states, audit
events, pending reasons, usage, the AllocationCycle row) is one transaction. The snapshot
and the plan are read outside it, so the transaction first re-reads what may have moved
meanwhile (an operator's cancel or override): jobs no longer queued and GPUs taken since
are skipped, and the database's one-active-placement index is the last word. On SQLite the
transaction takes the write lock at BEGIN (IMMEDIATE), so that re-read is exact; on
PostgreSQL the rows of the jobs it places are locked (SELECT ... FOR UPDATE).

Rows are written with pool.bulk (executemany on SQLite, COPY on PostgreSQL): a cycle on a
large cluster writes thousands of proposals, their GPUs and audit events.

After commit: scheduler.signals.placements_approved for auto-approved placements (dispatch
listens) and job_state_changed.

Policies (scheduler.engine.policies). A preemption is a Placement(kind="preemption") with
the victims' job ids in `victims` and its GPUs in gains["gpu_ids"], but no PlacementGpu rows
yet: the victims' placements still hold those GPUs (one active placement per GPU). Once
approved (by the pool's policy or an operator) the victims are asked to stop (the cancel's
stop path: SIGTERM, then kill after the agent's grace); the snapshot keeps its GPUs out of
other jobs' reach meanwhile; when every victim placement has ended, `claim_preemptions`
(at the start of each cycle) gives it its PlacementGpu rows and dispatches it. A remote
placement (kind "remote", `site`) is an ordinary placement that always waits for an
operator. A rebalancing move is a Placement(kind="rebalance", moves_placement=the running
one) with no GPUs, always proposed; accepting it stops the old placement and requeues the job.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from pool import bulk

from core import faults

from . import engine, signals, snapshot
from .engine.plan import duration
from .audit import POLICY, SCHEDULER, SYSTEM
from .models import AllocationCycle, AuditEvent, Job, Placement, PlacementGpu, Tenant
from .policy import PREEMPTED_PREFIX, operator_needed, request_stops, victim_placements

log = logging.getLogger(__name__)

LOCK_PREFIX = "fabricpool:lock:scheduler-cycle"
# Delete the key only if it still holds our token (it may have expired and been retaken).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"

EXPIRED = "expired"  # pending_reason of a job whose proposal expired


@dataclass
class CycleResult:
    ok: bool
    skipped: str = ""
    error: str = ""
    cycle_id: int | None = None
    expired: int = 0
    proposed: int = 0  # waiting for an operator
    auto_approved: int = 0
    pending: int = 0
    conflicts: int = 0  # placements dropped because a job or GPU changed while planning
    snapshot_s: float = 0.0
    plan_s: float = 0.0
    persist_s: float = 0.0
    pending_reasons: dict = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.snapshot_s + self.plan_s + self.persist_s

    def as_dict(self) -> dict:
        return {**asdict(self), "total_s": self.total_s}


# -- the lock ------------------------------------------------------------------------------------

def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=5)


def lock_key() -> str:
    """Per database: two deployments (or a test run next to a demo) sharing one Redis do not
    block each other. An in-memory SQLite database belongs to one process: so does its lock."""
    name = str(connection.settings_dict["NAME"])
    if name == ":memory:" or "mode=memory" in name:
        name = f"{name}:pid{os.getpid()}"
    return f"{LOCK_PREFIX}:{name}"


def lock_ttl() -> float:
    return float(getattr(settings, "CYCLE_LOCK_TTL", 60.0))


def _release(key: str, token: str) -> None:
    try:
        _redis().eval(_RELEASE, 1, key, token)
    except redis.RedisError as exc:
        log.warning("could not release %s (%s); it expires by itself", key, exc)


# -- the cycle -----------------------------------------------------------------------------------

def run_cycle(now: datetime | None = None) -> CycleResult:
    """Run one cycle unless another holds the lock. Never raises for a failed cycle: the error
    is on the result and on an AllocationCycle row."""
    key, token = lock_key(), uuid.uuid4().hex
    try:
        acquired = _redis().set(key, token, nx=True, px=int(lock_ttl() * 1000))
    except redis.RedisError as exc:
        log.error("allocation cycle not started: cannot take its lock in Redis (%s)", exc)
        return CycleResult(ok=False, error=f"cannot take the cycle lock in Redis: {exc}")
    if not acquired:
        log.info("allocation cycle skipped: another cycle is running")
        return CycleResult(ok=False, skipped="another cycle is running")
    try:
        return run_unlocked(now)
    finally:
        _release(key, token)


def run_unlocked(now: datetime | None = None) -> CycleResult:
    """The cycle itself, for callers that hold the lock (and benchmarks)."""
    now = now or timezone.now()
    result = CycleResult(ok=False)
    try:
        result.expired = len(expire_proposals(now))
        claim_preemptions(now)
        t0 = time.perf_counter()
        taken = snapshot.take(now)
        t1 = time.perf_counter()
        result.snapshot_s = t1 - t0
        plan = engine.plan(taken.snapshot)
        t2 = time.perf_counter()
        result.plan_s = t2 - t1
        with transaction.atomic():
            persist(taken, plan, result)
            result.persist_s = time.perf_counter() - t2
            AllocationCycle.objects.filter(pk=result.cycle_id).update(
                persist_s=result.persist_s, finished_at=timezone.now())
        result.ok = True
    except Exception as exc:  # noqa: BLE001 - a failed cycle is recorded, and the next one starts cleanly
        log.exception("allocation cycle failed")
        result.error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, engine.SnapshotError) else \
            f"inconsistent snapshot: {exc}"
        result.cycle_id = None
        AllocationCycle.objects.create(started_at=now, finished_at=timezone.now(), snapshot_s=result.snapshot_s or None,
                                       plan_s=result.plan_s or None, expired=result.expired, error=result.error[:2000])
        return result
    log.info("allocation cycle %s: %s auto-approved, %s proposed, %s pending, %s expired in %.2f s",
             result.cycle_id, result.auto_approved, result.proposed, result.pending, result.expired, result.total_s)
    return result


def persist(taken: snapshot.Taken, plan: engine.Plan, result: CycleResult) -> None:
    """Write the plan (inside the caller's transaction)."""
    now = taken.now
    cycle = AllocationCycle.objects.create(
        started_at=now, snapshot_s=result.snapshot_s, plan_s=result.plan_s, gpus_total=taken.gpus_total,
        gpus_free=taken.gpus_free, jobs_queued=len(taken.pending), expired=result.expired)
    result.cycle_id = cycle.pk

    # What moved since the snapshot. Re-read under the write lock (SQLite) / lock the rows (PostgreSQL).
    placed = [d for d in plan.decisions if d.placed]
    queued_now = set(Job.objects.filter(state__in=snapshot.QUEUED_STATES).order_by().values_list("id", flat=True))
    placeable = queued_now
    if connection.features.has_select_for_update and placed:
        ids, step = [d.job_id for d in placed], 5000
        placeable = set()
        for i in range(0, len(ids), step):
            placeable.update(Job.objects.select_for_update().filter(
                id__in=ids[i:i + step], state__in=snapshot.QUEUED_STATES).order_by().values_list("id", flat=True))
    busy = set(PlacementGpu.objects.filter(active=True).order_by().values_list("gpu_id", flat=True))
    # sharing: shares on the GPUs fractional decisions chose, read under the GPU rows' lock.
    share_use, gpu_mem = {}, {}
    shared_ids = [g for d in placed if d.shares for g in d.gpu_ids]
    if shared_ids:
        from pool.models import Gpu
        rows = Gpu.objects.filter(pk__in=shared_ids).order_by("pk")
        if connection.features.has_select_for_update:
            rows = rows.select_for_update()
        gpu_mem = dict(rows.values_list("pk", "memory_mib"))
        for gid, milli, mem in PlacementGpu.objects.filter(active=True, gpu_id__in=shared_ids, share_milli__lt=1000
                                                           ).order_by().values_list("gpu_id", "share_milli", "memory_mib"):
            use = share_use.setdefault(gid, [0, 0])
            use[0] += milli
            use[1] += mem
    # sharing: end
    # Preemptions: the victims' GPUs are busy (theirs); a victim must still be running, unstopped.
    victim_gpus, victims_ok = {}, set()
    victims = {r.placement: r for r in taken.snapshot.running if r.preemptible}
    if any(d.kind == engine.PREEMPTION for d in placed):
        victims_ok = set(Placement.objects.filter(pk__in=list(victims), state=Placement.State.RUNNING,
                                                  stop_requested_at__isnull=True).values_list("pk", flat=True))
        victim_gpus = {pid: set(r.gpu_ids) for pid, r in victims.items()}

    ttl = timedelta(seconds=float(settings.PROPOSAL_TTL))
    db_now = bulk.db_datetime(now)
    expires = bulk.db_datetime(now + ttl)
    placement_rows, chosen = [], []
    for d in placed:
        gains = d.gains
        mine = set(d.gpu_ids)
        if d.kind == engine.PREEMPTION:
            theirs = victim_placements(gains)
            if not set(theirs) <= victims_ok:
                result.conflicts += 1  # a victim ended or is stopping meanwhile: next cycle decides again
                continue
            mine -= set().union(*(victim_gpus[v] for v in theirs))
        if d.shares:  # sharing: beside the shares on its GPU (sum <= 1000, memory), never beside a whole one
            gid, milli, mem, _ = d.shares[0]
            use = share_use.get(gid, [0, 0])
            if (d.job_id not in placeable or (gid in busy and gid not in share_use) or use[0] + milli > 1000
                    or (mem and gpu_mem.get(gid) and use[1] + mem > gpu_mem[gid])):
                result.conflicts += 1
                continue
            share_use[gid] = [use[0] + milli, use[1] + mem]
        elif d.job_id not in placeable or not busy.isdisjoint(mine):  # sharing: elif (was if)
            result.conflicts += 1
            continue
        busy.update(d.gpu_ids)
        row = taken.pending[d.job_id]
        why = operator_needed(taken.policies.get(row.pool_id), len(d.gpu_ids), d.cost.pod_crossings,
                              preemption=d.kind == engine.PREEMPTION, remote=d.kind == engine.REMOTE)
        state = Placement.State.PROPOSED if why else Placement.State.APPROVED
        explanation = d.message + (f" Waits for an operator: {why}." if why else "")
        c = d.cost
        placement_rows.append((
            d.job_id, cycle.pk, state, c.hosts, c.leaves, c.pod_crossings, c.health_penalty, c.fragmentation_left,
            d.leaves_lower_bound, explanation, d.borrowed, d.borrowed_gpus, d.partial, False, "[]", "{}",
            "" if why else POLICY, None if why else db_now, "", expires if why else None, 1, db_now, "",
            d.kind, d.site, json.dumps(list(d.victims)), json.dumps(gains)))
        chosen.append((d, row, state, why))
    bulk.insert_rows(Placement, [
        "job", "cycle", "state", "hosts", "leaves", "pod_crossings", "health_penalty", "fragmentation_left",
        "lower_bound_leaves", "explanation", "borrowed", "borrowed_gpus", "partial", "is_override", "proposed_gpus",
        "proposed_cost", "decided_by_name", "decided_at", "reject_reason", "expires_at", "version", "created_at",
        "message", "kind", "site", "victims", "gains"], placement_rows, prepared=True)
    faults.pause_point("cycle.persist")  # reliability tests kill the worker here, mid-transaction
    placement_of = dict(Placement.objects.filter(cycle=cycle).order_by().values_list("job_id", "id"))
    # A preemption gets its GPU rows when its victims have stopped (claim_preemptions).
    bulk.insert_rows(PlacementGpu, ["placement", "gpu", "active", "share_milli", "memory_mib", "mig_device"],
                     [(placement_of[d.job_id], gpu, True, *(d.shares[0][1:] if d.shares else (1000, 0, "")))  # sharing
                      for d, _, _, _ in chosen if d.kind != engine.PREEMPTION for gpu in d.gpu_ids])

    job_rows, audit_rows, approved, stops = [], [], [], []
    for d, row, state, why in chosen:
        pid = placement_of[d.job_id]
        job_rows.append((d.job_id, state, db_now, "", "", None))
        data = json.dumps({"cycle": cycle.pk, "gpus": len(d.gpu_ids), "cost": d.cost.as_dict(), "kind": d.kind,
                           **({"victims": list(d.victims)} if d.victims else {}),
                           **({"site": d.site} if d.site else {})})
        if d.kind == engine.PREEMPTION and not why:
            stops += request_stops(victim_placements(d.gains), f"{PREEMPTED_PREFIX}{d.job_id} (placement {pid})",
                                   now, POLICY, "preempt", {"by_job": d.job_id, "by_placement": pid})
        if why:
            result.proposed += 1
            audit_rows.append((db_now, SCHEDULER, "propose", False, d.job_id, pid, row.state, Job.State.PROPOSED,
                               d.message, data))
        else:
            # Proposed and approved in one transaction: nobody ever sees it proposed, so one
            # event (pending -> approved, by the policy) tells the whole story.
            result.auto_approved += 1
            if d.kind != engine.PREEMPTION:  # a preemption is dispatched once its victims stopped
                approved.append(pid)
            audit_rows.append((db_now, POLICY, "approve", False, d.job_id, pid, row.state, Job.State.APPROVED,
                               d.message + " Approved automatically by the pool's policy.", data))
    bulk.update_rows(Job, ["state", "state_changed_at", "pending_reason", "pending_message", "expected_start"],
                     job_rows, prepared=True)
    bulk.insert_rows(AuditEvent, ["created_at", "actor", "action", "refused", "job", "placement", "from_state",
                                  "to_state", "message", "data"], audit_rows, prepared=True)

    # Why the others wait: written only where it changed.
    reason_rows = []
    for d in plan.decisions:
        if d.placed or d.job_id not in queued_now:
            continue
        result.pending += 1
        row = taken.pending[d.job_id]
        expected = datetime.fromtimestamp(d.expected_start, UTC).replace(microsecond=0) \
            if d.expected_start is not None else None
        if (row.reason, row.message, row.expected_start) != (d.reason, d.message, expected):
            reason_rows.append((d.job_id, d.reason or "", d.message, expected))
    bulk.update_rows(Job, ["pending_reason", "pending_message", "expected_start"], reason_rows)
    result.pending_reasons = plan.pending_reasons()

    _propose_moves(plan, cycle, now, now + ttl)
    _update_usage(taken)
    AllocationCycle.objects.filter(pk=cycle.pk).update(
        proposed=result.proposed, auto_approved=result.auto_approved, pending=result.pending,
        pending_reasons=result.pending_reasons)

    proposed_jobs = [d.job_id for d, _, state, _ in chosen if state == Placement.State.PROPOSED]
    approved_jobs = [d.job_id for d, _, state, _ in chosen if state == Placement.State.APPROVED]
    transaction.on_commit(lambda: _announce(approved, proposed_jobs, approved_jobs))
    if stops:
        transaction.on_commit(lambda: _send(signals.placements_stop_requested, placement_ids=stops))


def _propose_moves(plan: engine.Plan, cycle: AllocationCycle, now, expires) -> None:
    """Rebalancing proposals: one per running placement at a time, always for an operator."""
    if not plan.moves:
        return
    wanted = {m.placement: m for m in plan.moves if m.placement is not None}
    already = set(Placement.objects.filter(kind=Placement.Kind.REBALANCE, state=Placement.State.PROPOSED,
                                           moves_placement_id__in=list(wanted)).values_list("moves_placement_id",
                                                                                             flat=True))
    running = set(Placement.objects.filter(pk__in=list(wanted), state=Placement.State.RUNNING,
                                           stop_requested_at__isnull=True).values_list("pk", flat=True))
    rows = []
    for pid, m in wanted.items():
        if pid in already or pid not in running:
            continue
        gains = {**m.gains, "why": m.why, "from_gpus": list(m.from_gpus), "to_gpus": list(m.to_gpus)}
        rows.append(Placement(job_id=m.job_id, cycle=cycle, state=Placement.State.PROPOSED,
                              kind=Placement.Kind.REBALANCE, moves_placement_id=pid, gains=gains,
                              explanation=m.message + " Waits for an operator: moves are proposed, never automatic.",
                              expires_at=expires, created_at=now))
    for p in Placement.objects.bulk_create(rows):
        AuditEvent.objects.create(created_at=now, actor=SCHEDULER, action="propose_move", job_id=p.job_id,
                                  placement_id=p.pk, message=p.explanation, data=p.gains)


def claim_preemptions(now: datetime | None = None) -> list[int]:
    """Approved preemptions whose victims have all stopped get their GPUs and are dispatched.
    One whose GPUs another placement took meanwhile fails and its job goes back to the queue."""
    now = now or timezone.now()
    waiting = list(Placement.objects.filter(kind=Placement.Kind.PREEMPTION, state=Placement.State.APPROVED)
                   .exclude(placement_gpus__active=True).order_by("pk").values_list("pk", "job_id", "gains"))
    if not waiting:
        return []
    claimed = []
    for pid, job_id, gains in waiting:
        still = Placement.objects.filter(pk__in=victim_placements(gains), state__in=Placement.ACTIVE_STATES)
        if still.exists():
            continue
        gpu_ids = [int(g) for g in gains.get("gpu_ids", ())]
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(pk=job_id).first()
            p = Placement.objects.select_for_update().filter(pk=pid, state=Placement.State.APPROVED).first()
            if job is None or p is None:
                continue
            try:
                with transaction.atomic():
                    PlacementGpu.objects.bulk_create([PlacementGpu(placement=p, gpu_id=g, active=True)
                                                      for g in gpu_ids])
            except IntegrityError:
                message = "Its preempted GPUs were taken by another placement before it could start; back in the queue."
                Placement.objects.filter(pk=pid).update(state=Placement.State.FAILED, finished_at=now,
                                                        message=message, version=F("version") + 1)
                Job.objects.filter(pk=job_id, state=Job.State.APPROVED).update(
                    state=Job.State.PENDING, state_changed_at=now, pending_reason="preemption_failed",
                    pending_message=message)
                AuditEvent.objects.create(created_at=now, actor=SYSTEM, action="preemption_failed", job_id=job_id,
                                          placement_id=pid, from_state=job.state, to_state=Job.State.PENDING,
                                          message=message)
                continue
            Placement.objects.filter(pk=pid).update(version=F("version") + 1)
            AuditEvent.objects.create(created_at=now, actor=SYSTEM, action="claim", job_id=job_id, placement_id=pid,
                                      message=f"its victims stopped: it takes their {len(gpu_ids)} GPUs",
                                      data={"gpu_ids": gpu_ids})
            claimed.append(pid)
    if claimed:
        _send(signals.placements_approved, placement_ids=claimed)
    return claimed


def _update_usage(taken: snapshot.Taken) -> None:
    """Fair-share usage: decay, then add the GPU-seconds running since the last update."""
    now = taken.now
    rows = []
    for tid, usage, at in Tenant.objects.order_by().values_list("id", "usage_gpu_seconds", "usage_updated_at"):
        running = taken.running_gpus_by_tenant.get(tid, 0)
        if not usage and not running and at is not None:
            continue
        dt = max(0.0, (now - at).total_seconds()) if at is not None else 0.0
        rows.append((tid, snapshot.usage_now(usage, at, now) + running * dt, now))
    bulk.update_rows(Tenant, ["usage_gpu_seconds", "usage_updated_at"], rows)


def _announce(approved_placements, proposed_jobs, approved_jobs) -> None:
    sends = [(signals.placements_approved, {"placement_ids": approved_placements})] if approved_placements else []
    sends += [(signals.job_state_changed, {"job_ids": ids, "to_state": state})
              for ids, state in ((proposed_jobs, Job.State.PROPOSED), (approved_jobs, Job.State.APPROVED)) if ids]
    for signal, kwargs in sends:
        _send(signal, **kwargs)


def _send(signal, **kwargs) -> None:
    """Send after commit; a failing receiver is logged, never undoes or breaks the cycle."""
    for receiver, response in signal.send_robust(sender=AllocationCycle, **kwargs):
        if isinstance(response, Exception):
            log.error("receiver %r of %s failed", receiver, kwargs, exc_info=response)


# -- expiry --------------------------------------------------------------------------------------

def expire_proposals(now: datetime | None = None) -> list[int]:
    """Proposals nobody decided within PROPOSAL_TTL: expired, their GPUs back in the pool,
    their jobs back in the queue. Returns the placement ids (one transaction)."""
    now = now or timezone.now()
    with transaction.atomic():
        due = Placement.objects.filter(state=Placement.State.PROPOSED, expires_at__lte=now)
        # Jobs first, then placements: the lock order of every decision path.
        list(Job.objects.select_for_update().filter(pk__in=due.values("job_id")).order_by("pk").values_list("pk", flat=True))
        rows = list(Placement.objects.select_for_update().filter(
            state=Placement.State.PROPOSED, expires_at__lte=now).order_by("pk").values_list("id", "job_id", "kind"))
        if not rows:
            return []
        ids = [pid for pid, _, _ in rows]
        moves = [(pid, jid) for pid, jid, kind in rows if kind == Placement.Kind.REBALANCE]
        rows = [(pid, jid) for pid, jid, kind in rows if kind != Placement.Kind.REBALANCE]
        Placement.objects.filter(id__in=ids).update(state=Placement.State.EXPIRED, finished_at=now,
                                                    version=F("version") + 1)
        PlacementGpu.objects.filter(placement_id__in=ids, active=True).update(active=False)
        minutes = duration(float(settings.PROPOSAL_TTL))
        message = f"Its proposal expired: nobody decided within {minutes}. It is back in the queue."
        job_ids = [jid for _, jid in rows]
        Job.objects.filter(id__in=job_ids, state=Job.State.PROPOSED).update(
            state=Job.State.PENDING, state_changed_at=now, pending_reason=EXPIRED, pending_message=message,
            expected_start=None)
        AuditEvent.objects.bulk_create([
            AuditEvent(created_at=now, actor=SYSTEM, action="expire", job_id=jid, placement_id=pid,
                       from_state=Job.State.PROPOSED, to_state=Job.State.PENDING, message=message)
            for pid, jid in rows] + [
            AuditEvent(created_at=now, actor=SYSTEM, action="expire", job_id=jid, placement_id=pid,
                       message=f"The proposed move expired: nobody decided within {minutes}. The job keeps running.")
            for pid, jid in moves])
        transaction.on_commit(lambda: _send(signals.job_state_changed, job_ids=job_ids, to_state=Job.State.PENDING))
    log.info("%s proposals expired", len(ids))
    return ids
