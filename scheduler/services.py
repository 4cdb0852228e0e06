"""What people do to the scheduler, for views, the API, admin and commands alike: decide on
proposals (approve, reject, override), cancel jobs, submit jobs.

Each decision names the placement version the person saw. Inside one transaction the
placement row is locked (SELECT ... FOR UPDATE on PostgreSQL; SQLite's IMMEDIATE
transactions serialise writers) and its version compared: of two operators deciding at
once exactly one wins, the other gets ChangedUnderYou saying what happened. Every attempt
is in the audit log, refused ones too (written after the refused transaction rolled back).

Permissions: deciding needs scheduler.decide_placement, cancelling scheduler.change_job,
submitting scheduler.add_job (operators and admins; viewers get PermissionDenied).
"""
from __future__ import annotations

import logging
import re
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from pool.models import Gpu, Pool

from . import audit, engine, signals, snapshot
from .engine import sharing
from .models import Job, Placement, PlacementGpu, PoolPolicy, Tenant
from .policy import MOVED_PREFIX, PREEMPTED_PREFIX, operator_needed, request_stops, victim_placements

log = logging.getLogger(__name__)

DECIDE = "scheduler.decide_placement"
CANCEL = "scheduler.change_job"
SUBMIT = "scheduler.add_job"
REJECTED = "rejected"  # pending_reason of a job whose proposal was rejected


class DecisionError(Exception):
    """A decision that was refused; `str(error)` is the sentence to show."""


class NotDecidable(DecisionError):
    pass


class ChangedUnderYou(DecisionError):
    pass


class InvalidOverride(DecisionError):
    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


class GpusTaken(DecisionError):
    pass


class NotCancellable(DecisionError):
    pass


# -- helpers -------------------------------------------------------------------------------------

def _require(actor, perm: str, what: str) -> None:
    if actor is None or not getattr(actor, "is_authenticated", False) or not actor.has_perm(perm):
        raise PermissionDenied(f"{audit.actor_name(actor) if actor else 'Anonymous users'} may not {what}: "
                               "it needs the operator role.")


def _when(dt) -> str:
    return timezone.localtime(dt).strftime("%H:%M") if dt else "an unknown time"


def _current(p: Placement) -> str:
    """What the placement is now, for people: "approved by alice at 14:03"."""
    decided = f"by {p.decided_by_name or 'someone'} at {_when(p.decided_at)}"
    if p.state in (Placement.State.APPROVED, Placement.State.REJECTED):
        return f"{p.state} {decided}"
    if p.state == Placement.State.PROPOSED and p.is_override:
        who = p.overridden_by.get_username() if p.overridden_by else "someone"
        return f"an override by {who} at {_when(p.overridden_at)}, waiting for approval"
    if p.state in (Placement.State.EXPIRED, Placement.State.CANCELLED):
        return f"{p.state} at {_when(p.finished_at)}"
    if p.decided_at:
        return f"{p.state} (approved {decided})"
    return p.state


def _locked(placement) -> Placement:
    pk = placement.pk if isinstance(placement, Placement) else int(placement)
    # Lock order everywhere: the job, then its placements (as cancel_job, dispatch and
    # reconcile do), so two decisions on PostgreSQL can never deadlock.
    job_id = Placement.objects.filter(pk=pk).values_list("job_id", flat=True).first()
    if job_id is not None:
        list(Job.objects.select_for_update().filter(pk=job_id).values_list("pk", flat=True))
    try:
        # Lock only the placement row (the user of a nullable join cannot be locked on PostgreSQL).
        rows = Placement.objects.select_for_update(of=("self",))
        return rows.select_related("job", "job__pool", "job__tenant", "overridden_by").get(pk=pk)
    except Placement.DoesNotExist:
        raise NotDecidable(f"Placement {pk} does not exist.") from None


def _check(p: Placement, expected_version) -> None:
    if expected_version is not None and int(expected_version) != p.version:
        raise ChangedUnderYou(f"Placement {p.pk} changed under you: it is now {_current(p)}. "
                              "Look at it again before deciding.")
    if p.state not in Placement.DECIDABLE_STATES:
        raise NotDecidable(f"Placement {p.pk} is not decidable: it is {_current(p)}; only proposed placements "
                           "can be approved, rejected or overridden.")


def _attempt(action: str, placement, actor, work, data: dict | None = None):
    """Run `work(locked placement)` in a transaction; audit a refusal after the rollback."""
    try:
        with transaction.atomic():
            _require(actor, DECIDE, f"{action} placements")
            p = _locked(placement)
            return work(p)
    except (DecisionError, PermissionDenied) as exc:
        pk = placement.pk if isinstance(placement, Placement) else placement
        row = Placement.objects.filter(pk=pk).values_list("job_id", "state").first()
        audit.record(actor, action, job=row[0] if row else None, placement=pk if row else None, refused=True,
                     message=str(exc), data={**(data or {}), "error": type(exc).__name__})
        raise


def _policy(pool_id) -> PoolPolicy | None:
    return PoolPolicy.objects.select_related("pool").filter(pool_id=pool_id).first()


def _release_gpus(p: Placement) -> None:
    PlacementGpu.objects.filter(placement=p, active=True).update(active=False)


def _after_commit(approved_ids=(), job_ids=(), to_state="", stop_ids=()) -> None:
    def send():
        sends = []
        if approved_ids:
            sends.append((signals.placements_approved, {"placement_ids": list(approved_ids)}))
        if stop_ids:
            sends.append((signals.placements_stop_requested, {"placement_ids": list(stop_ids)}))
        if job_ids:
            sends.append((signals.job_state_changed, {"job_ids": list(job_ids), "to_state": to_state}))
        for signal, kwargs in sends:
            for receiver, response in signal.send_robust(sender=Placement, **kwargs):
                if isinstance(response, Exception):
                    log.error("receiver %r of %s failed", receiver, kwargs, exc_info=response)
    transaction.on_commit(send)


def _approve_now(p: Placement, actor, now, message: str) -> None:
    """Proposed -> approved (placement and job), audited; dispatch after commit. A preemption
    instead stops its victims (it is dispatched once they stopped); a move is accepted."""
    if p.kind == Placement.Kind.REBALANCE:
        _accept_move(p, actor, now)
        return
    name = audit.actor_name(actor)
    # Read the job's state now: after the update below a refreshed placement reloads it as approved.
    from_state = Job.objects.filter(pk=p.job_id).values_list("state", flat=True).get()
    Placement.objects.filter(pk=p.pk).update(
        state=Placement.State.APPROVED, decided_by=actor, decided_by_name=name, decided_at=now, expires_at=None,
        version=F("version") + 1)
    Job.objects.filter(pk=p.job_id).update(state=Job.State.APPROVED, state_changed_at=now)
    audit.record(actor, "approve", job=p.job_id, placement=p, from_state=from_state, to_state=Job.State.APPROVED,
                 message=message)
    if p.kind == Placement.Kind.PREEMPTION:
        stops = request_stops(victim_placements(p.gains), f"{PREEMPTED_PREFIX}{p.job_id} (placement {p.pk})", now,
                              name, "preempt", {"by_job": p.job_id, "by_placement": p.pk})
        _after_commit(job_ids=[p.job_id], to_state=Job.State.APPROVED, stop_ids=stops)
        return
    _after_commit(approved_ids=[p.pk], job_ids=[p.job_id], to_state=Job.State.APPROVED)


def _accept_move(p: Placement, actor, now) -> None:
    """A rebalancing move accepted: the running placement it replaces is stopped (the job goes
    back to the queue when its agents confirm, scheduler.reconcile); the proposal is done."""
    name = audit.actor_name(actor)
    Placement.objects.filter(pk=p.pk).update(
        state=Placement.State.FINISHED, decided_by=actor, decided_by_name=name, decided_at=now, expires_at=None,
        finished_at=now, message=f"accepted by {name}", version=F("version") + 1)
    stops = request_stops([p.moves_placement_id], f"{MOVED_PREFIX} (accepted by {name})", now, name, "move",
                          {"proposal": p.pk, **(p.gains or {})}) if p.moves_placement_id else []
    audit.record(actor, "accept_move", job=p.job_id, placement=p,
                 message=f"move accepted by {name}" + ("; stopping the running placement" if stops else
                                                       "; the placement it would move is no longer running"))
    _after_commit(stop_ids=stops)


# -- decisions -----------------------------------------------------------------------------------

def approve(placement, actor, expected_version) -> Placement:
    """Approve a proposal. `expected_version`: the version the actor saw (None: whatever it is now)."""
    def work(p):
        _check(p, expected_version)
        _approve_now(p, actor, timezone.now(), f"approved by {audit.actor_name(actor)}")
        p.refresh_from_db()
        return p
    return _attempt("approve", placement, actor, work)


def reject(placement, actor, reason: str, expected_version) -> Placement:
    """Reject a proposal: its GPUs go back to the pool, its job back to the queue with the reason."""
    reason = (reason or "").strip()

    def work(p):
        _check(p, expected_version)
        now = timezone.now()
        name = audit.actor_name(actor)
        message = f"rejected by {name}" + (f": {reason}" if reason else "")
        Placement.objects.filter(pk=p.pk).update(
            state=Placement.State.REJECTED, decided_by=actor, decided_by_name=name, decided_at=now,
            reject_reason=reason, expires_at=None, finished_at=now, version=F("version") + 1)
        if p.kind == Placement.Kind.REBALANCE:  # the job keeps running where it is
            audit.record(actor, "reject", job=p.job_id, placement=p, message=f"move {message}",
                         data={"reason": reason})
            p.refresh_from_db()
            return p
        _release_gpus(p)
        Job.objects.filter(pk=p.job_id).update(state=Job.State.PENDING, state_changed_at=now, pending_reason=REJECTED,
                                               pending_message=message[:1].upper() + message[1:] + ".",
                                               expected_start=None)
        audit.record(actor, "reject", job=p.job_id, placement=p, from_state=p.job.state, to_state=Job.State.PENDING,
                     message=message, data={"reason": reason})
        _after_commit(job_ids=[p.job_id], to_state=Job.State.PENDING)
        p.refresh_from_db()
        return p
    return _attempt("reject", placement, actor, work, {"reason": reason})


def override(placement, actor, gpu_ids, expected_version) -> Placement:
    """Give the job of a proposal the GPUs the operator chose instead. Checked against the
    same rules as the engine's own proposals (validate_and_cost) and against every other
    active placement; stored with the proposed GPUs and cost next to the chosen ones. Then
    approved, or left for a second decision when the pool's policy says so."""
    try:
        chosen = [int(g) for g in gpu_ids]
        if any(isinstance(g, bool) for g in gpu_ids):
            raise TypeError
    except (TypeError, ValueError):
        chosen = None

    def work(p):
        _check(p, expected_version)
        if p.kind in (Placement.Kind.PREEMPTION, Placement.Kind.REBALANCE):
            raise NotDecidable(f"Placement {p.pk} is a {p.get_kind_display()}: approve or reject it; its GPUs "
                               "cannot be overridden.")
        if not chosen:
            raise InvalidOverride("The override names no GPUs (give GPU ids).", ["No GPUs were chosen."])
        now = timezone.now()
        job = p.job
        taken = _taken_elsewhere(p, chosen)
        if taken:
            raise GpusTaken("Some of the chosen GPUs are taken: " + "; ".join(taken) + ".")
        snap = snapshot.take(now, with_queue=False).snapshot
        cost = engine.validate_and_cost(snapshot.job_for_engine(job), chosen, snap)
        if isinstance(cost, list):
            raise InvalidOverride("The chosen GPUs break the job's rules: " + " ".join(cost), cost)
        current = list(PlacementGpu.objects.filter(placement=p, active=True).order_by("gpu_id")
                       .values_list("gpu_id", flat=True))
        name = audit.actor_name(actor)
        proposed_gpus = p.proposed_gpus if p.is_override else current
        proposed_cost = p.proposed_cost if p.is_override else p.cost_dict()
        why = operator_needed(_policy(job.pool_id), len(chosen), cost.pod_crossings, override=True)
        # Swap the GPUs: the old rows go (the proposal is kept in proposed_gpus), the new ones
        # come in; the partial unique index refuses a GPU another placement took meanwhile.
        PlacementGpu.objects.filter(placement=p).delete()
        try:
            with transaction.atomic():
                PlacementGpu.objects.bulk_create([PlacementGpu(placement=p, gpu_id=g, active=True) for g in chosen])
        except IntegrityError:
            raise GpusTaken("Some of the chosen GPUs were taken by another placement a moment ago; "
                            "choose again.") from None
        Placement.objects.filter(pk=p.pk).update(
            is_override=True, proposed_gpus=proposed_gpus, proposed_cost=proposed_cost, overridden_by=actor,
            overridden_at=now, hosts=cost.hosts, leaves=cost.leaves, pod_crossings=cost.pod_crossings,
            health_penalty=cost.health_penalty, fragmentation_left=cost.fragmentation_left,
            partial=len(chosen) < job.gpus, version=F("version") + 1,
            explanation=f"Override by {name}: {len(chosen)} GPUs on {cost.hosts} hosts and {cost.leaves} leaf "
                        f"switches, chosen instead of the proposal ({proposed_cost.get('hosts')} hosts, "
                        f"{proposed_cost.get('leaves')} leaf switches).",
            expires_at=now + timedelta(seconds=float(settings.PROPOSAL_TTL)) if why else None)
        audit.record(actor, "override", job=job, placement=p, message=f"overridden by {name}" +
                     (f"; waits for approval: {why}" if why else ""),
                     data={"proposed_gpus": proposed_gpus, "proposed_cost": proposed_cost, "chosen_gpus": chosen,
                           "chosen_cost": cost.as_dict()})
        if not why:
            p.refresh_from_db()
            _approve_now(p, actor, now, f"override approved by {name}")
        p.refresh_from_db()
        return p
    return _attempt("override", placement, actor, work, {"gpu_ids": [str(g) for g in gpu_ids][:64]
                                                          if isinstance(gpu_ids, (list, tuple)) else str(gpu_ids)})


def _taken_elsewhere(p: Placement, gpu_ids) -> list[str]:
    rows = PlacementGpu.objects.filter(active=True, gpu_id__in=gpu_ids).exclude(placement=p).select_related(
        "gpu__host", "placement").order_by("gpu_id")
    return [f"{r.gpu} is held by job {r.placement.job_id} ({r.placement.state})" for r in rows]


# -- jobs ----------------------------------------------------------------------------------------

def cancel_job(job, actor) -> Job:
    """Cancel a job in any state that is not final. A proposed or approved placement ends now
    and frees its GPUs; a dispatching or running one is marked for stop (stop_requested_at):
    its GPUs stay held until its agents confirm the work stopped (dispatch sends the stop)."""
    pk = job.pk if isinstance(job, Job) else int(job)
    try:
        with transaction.atomic():
            _require(actor, CANCEL, "cancel jobs")
            try:
                j = Job.objects.select_for_update().get(pk=pk)
            except Job.DoesNotExist:
                raise NotCancellable(f"Job {pk} does not exist.") from None
            if j.is_final:
                raise NotCancellable(f"Job {pk} is already {j.state}; only unfinished jobs can be cancelled.")
            now = timezone.now()
            name = audit.actor_name(actor)
            stop = []
            for p in Placement.objects.select_for_update().filter(job=j, state__in=Placement.ACTIVE_STATES):
                if p.state in (Placement.State.PROPOSED, Placement.State.APPROVED):
                    Placement.objects.filter(pk=p.pk).update(state=Placement.State.CANCELLED, finished_at=now,
                                                             message=f"job cancelled by {name}", expires_at=None,
                                                             version=F("version") + 1)
                    _release_gpus(p)
                else:
                    Placement.objects.filter(pk=p.pk).update(stop_requested_at=now, message=f"job cancelled by {name}",
                                                             version=F("version") + 1)
                    stop.append(p.pk)
            Job.objects.filter(pk=pk).update(state=Job.State.CANCELLED, state_changed_at=now, finished_at=now,
                                             expected_start=None, message=f"cancelled by {name}")
            audit.record(actor, "cancel", job=j, from_state=j.state, to_state=Job.State.CANCELLED,
                         message=f"cancelled by {name}" + (" (its running work is being stopped)" if stop else ""))
            _after_commit(job_ids=[pk], to_state=Job.State.CANCELLED, stop_ids=stop)
    except (DecisionError, PermissionDenied) as exc:
        exists = Job.objects.filter(pk=pk).exists()
        audit.record(actor, "cancel", job=pk if exists else None, refused=True, message=str(exc),
                     data={"error": type(exc).__name__, "job": pk})
        raise
    return Job.objects.get(pk=pk)


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_GPUS = 100_000
MAX_RUNTIME_S = 366 * 24 * 3600


def submit_job(actor, *, tenant, pool, gpus, command, env=None, name="", gpu_models=(), min_memory_mib=0, fp64="",
               site="", task_class=Job.TaskClass.TRAINING, priority=0, gang=True, whole_hosts=True,
               estimated_runtime_s=None, max_runtime_s=None, preemptible=False, max_leaves=None,
               topology_hard=False, max_wait_s=0, restartable=False, allow_remote_site=False,
               grace_period_s=30, gpu_milli=0, gpu_memory_mib=0, mig_profile="") -> Job:
    """Validate and queue a job; ask for a cycle soon. `tenant`/`pool`: rows or names.
    `actor` None: a trusted caller (the command line). Raises ValidationError({field: message}).
    Sharing: `gpu_milli` (1-999 thousandths of one GPU), `gpu_memory_mib` and/or `mig_profile`
    ("1g.10gb"; not with a share) ask for a fraction of one GPU, so `gpus` must be 1."""
    if actor is not None:
        _require(actor, SUBMIT, "submit jobs")
    errors: dict[str, str] = {}

    def whole(field, value, minimum=0, maximum=None, optional=False):
        if value is None or value == "":
            if not optional:
                errors[field] = "required"
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                if isinstance(value, bool) or float(value) != int(float(value)):
                    raise ValueError
                value = int(float(value))
            except (TypeError, ValueError):
                errors[field] = f"expected a whole number, got {value!r}"
                return None
        if value < minimum or (maximum is not None and value > maximum):
            errors[field] = f"must be between {minimum} and {maximum}" if maximum is not None else \
                f"must be at least {minimum}"
            return None
        return value

    tenant_row = _named(Tenant, tenant, "tenant", errors)
    pool_row = _named(Pool, pool, "pool", errors)
    gpus = whole("gpus", gpus, 1, MAX_GPUS)
    min_memory_mib = whole("min_memory_mib", min_memory_mib or 0, 0, 10_000_000)
    priority = whole("priority", priority or 0, -1_000_000, 1_000_000)
    estimated_runtime_s = whole("estimated_runtime_s", estimated_runtime_s, 1, MAX_RUNTIME_S, optional=True)
    max_runtime_s = whole("max_runtime_s", max_runtime_s, 1, MAX_RUNTIME_S, optional=True)
    max_leaves = whole("max_leaves", max_leaves, 1, 100_000, optional=True)
    max_wait_s = whole("max_wait_s", max_wait_s or 0, 0, MAX_RUNTIME_S)
    grace_period_s = whole("grace_period_s", 30 if grace_period_s is None else grace_period_s, 0, 3600)
    if estimated_runtime_s and max_runtime_s and estimated_runtime_s > max_runtime_s:
        errors["estimated_runtime_s"] = f"{estimated_runtime_s} s is longer than the maximum run time {max_runtime_s} s"
    models_ = list(gpu_models or [])
    if not all(isinstance(m, str) and m.strip() and len(m) <= 80 for m in models_) or len(models_) > 32:
        errors["gpu_models"] = "expected a list of GPU model names (such as H100), each 1 to 80 characters"
    models_ = [m.strip() for m in models_ if isinstance(m, str)]
    fp64 = fp64 or ""
    if fp64 not in Job.Fp64.values:
        errors["fp64"] = f"expected one of {', '.join(v for v in Job.Fp64.values if v)} (or nothing), got {fp64!r}"
    if task_class not in Job.TaskClass.values:
        errors["task_class"] = f"expected one of {', '.join(Job.TaskClass.values)}, got {task_class!r}"
    if not isinstance(command, (list, tuple)) or not command or len(command) > 256 or \
            not all(isinstance(c, str) and len(c) < 4096 for c in command):
        errors["command"] = "expected a non-empty list of strings (argv), at most 256 of under 4096 characters"
    env = env or {}
    if not isinstance(env, dict) or len(env) > 200 or not all(
            isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str) and len(v) < 4096 for k, v in env.items()):
        errors["env"] = "expected at most 200 variables NAME=value (names: letters, digits, '_')"
    name = (name or "").strip()
    if len(name) > 200:
        errors["name"] = "at most 200 characters"
    site = (site or "").strip()
    if len(site) > 100:
        errors["site"] = "at most 100 characters"
    if allow_remote_site and not site:
        errors["allow_remote_site"] = "a job may run at another site only when it names its home site"
    for field, value in (("restartable", restartable), ("allow_remote_site", allow_remote_site)):
        if not isinstance(value, bool) and value not in (0, 1, None):
            errors[field] = f"expected true or false, got {value!r}"
    gpu_milli = whole("gpu_milli", gpu_milli or 0, 0, sharing.MILLI - 1)
    gpu_memory_mib = whole("gpu_memory_mib", gpu_memory_mib or 0, 0, 10_000_000)
    mig_profile = _mig_profile(mig_profile, gpu_milli, gpu_memory_mib, errors)
    if (gpu_milli or gpu_memory_mib or mig_profile) and gpus not in (None, 1):
        field = "gpu_milli" if gpu_milli else "gpu_memory_mib" if gpu_memory_mib else "mig_profile"
        errors.setdefault(field, f"a shared job runs on a fraction of one GPU: ask for 1 GPU, not {gpus}")
    if errors:
        raise ValidationError({k: [v] for k, v in errors.items()})

    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.create(
            name=name, tenant=tenant_row, pool=pool_row, gpus=gpus, gpu_models=models_, min_memory_mib=min_memory_mib,
            fp64=fp64, site=site, task_class=task_class, priority=priority, gang=bool(gang),
            whole_hosts=bool(whole_hosts),
            estimated_runtime_s=estimated_runtime_s, max_runtime_s=max_runtime_s, preemptible=bool(preemptible),
            max_leaves=max_leaves, topology_hard=bool(topology_hard), max_wait_s=max_wait_s, command=list(command),
            restartable=bool(restartable), allow_remote_site=bool(allow_remote_site), grace_period_s=grace_period_s,
            gpu_milli=gpu_milli, gpu_memory_mib=gpu_memory_mib, mig_profile=mig_profile,
            env=dict(env), submitted_by=actor if actor is not None else None, state=Job.State.PENDING,
            state_changed_at=now, created_at=now, pending_reason="new",
            pending_message="Submitted; waiting for the next allocation cycle.")
        audit.record(actor, "submit", job=job, to_state=Job.State.PENDING,
                     message=f"submitted: {gpus} GPUs in pool {pool_row.name} for tenant {tenant_row.name}")
        _after_commit(job_ids=[job.pk], to_state=Job.State.PENDING)
        transaction.on_commit(_cycle_soon)
    return job


def _mig_profile(value, gpu_milli, gpu_memory_mib, errors) -> str:
    """The MIG profile normalised ("3g.40gb"), "" for none; a problem goes to errors."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        errors["mig_profile"] = f"expected a MIG profile such as 1g.10gb, got {value!r}"
        return ""
    profile = value.strip().lower()
    try:
        sharing.parse_mig(profile)
    except sharing.SharingError as exc:
        errors["mig_profile"] = str(exc)[:300]
        return ""
    if gpu_milli or gpu_memory_mib:
        errors["mig_profile"] = ("a MIG profile fixes the share and the memory: give either mig_profile or "
                                 "gpu_milli/gpu_memory_mib, not both")
    return profile


def _named(model, value, field, errors):
    if isinstance(value, model):
        return value
    row = model.objects.filter(name=value).first() if isinstance(value, str) and value else None
    if row is None:
        known = list(model.objects.order_by("name").values_list("name", flat=True)[:20])
        errors[field] = f"no {field} named {value!r}; known: {', '.join(known) or 'none'}"
    return row


def _cycle_soon() -> None:
    from .tasks import request_cycle_soon  # tasks import Celery; services stay importable without a broker

    request_cycle_soon()


def gpu_ids_of(placement: Placement) -> list[int]:
    return list(PlacementGpu.objects.filter(placement=placement, active=True).order_by("gpu_id")
                .values_list("gpu_id", flat=True))


def gpu_labels(gpu_ids) -> dict[int, str]:
    return {g.pk: str(g) for g in Gpu.objects.filter(pk__in=list(gpu_ids)).select_related("host")}
