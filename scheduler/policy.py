"""Which proposals wait for an operator: the pool's PoolPolicy (none: approve automatically).
Load policies with select_related("pool"): the sentences name the pool."""
from __future__ import annotations

from django.db.models import F

from .models import PoolPolicy


def operator_needed(policy: PoolPolicy | None, gpus: int, pod_crossings: int, *, override: bool = False,
                    preemption: bool = False, remote: bool = False) -> str | None:
    """Why this placement waits for an operator (a sentence), or None to approve it now. An
    override is itself an operator's decision: only manual_for_overrides holds it back.
    A remote-site placement always waits; a preemption does unless the pool's policy
    exists and says manual_for_preemptions=False (no policy: preemptions wait)."""
    if remote:
        return "placements at another site always wait for an operator"
    if preemption and (policy is None or policy.manual_for_preemptions):
        return "preemptions in this pool wait for an operator"
    if policy is None:
        return None
    if override:
        return "overrides in this pool wait for a second decision" if policy.manual_for_overrides else None
    if policy.mode == PoolPolicy.Mode.MANUAL:
        return f"pool {policy.pool.name} approves every proposal by hand"
    if preemption and policy.manual_for_preemptions:
        return "preemptions in this pool wait for an operator"
    if policy.mode == PoolPolicy.Mode.THRESHOLD and gpus > policy.threshold_gpus:
        return f"it takes {gpus} GPUs, above this pool's threshold of {policy.threshold_gpus}"
    if policy.manual_when_crossing_spines and pod_crossings > 0:
        return f"it spans {pod_crossings + 1} pods (crosses the core switches)"
    return None


# -- preemption and rebalancing: stopping running work to requeue it -------------------------------
# The stop path is the cancel's (stop_requested_at, then the agents' stop); the placement's
# message says why, and scheduler.reconcile requeues the job (not cancelled) when it stopped.
PREEMPTED_PREFIX = "preempted by job "
MOVED_PREFIX = "moved by rebalancing"
PREEMPTED = "preempted"  # pending_reason of a requeued victim
MOVED = "moved"  # pending_reason of a job requeued by an accepted move


def request_stops(placement_ids, message: str, now, actor: str, action: str, data: dict | None = None) -> list[int]:
    """Ask the agents to stop these placements (those still active and not stopping); audited
    per placement. Returns the ids to send the stop for after commit (the caller's transaction)."""
    from .models import AuditEvent, Placement

    rows = list(Placement.objects.select_for_update().filter(
        pk__in=list(placement_ids), state__in=Placement.ACTIVE_STATES, stop_requested_at__isnull=True)
        .order_by("pk").values_list("pk", "job_id"))
    if not rows:
        return []
    Placement.objects.filter(pk__in=[pk for pk, _ in rows]).update(stop_requested_at=now, message=message[:2000],
                                                                  version=F("version") + 1)
    AuditEvent.objects.bulk_create([AuditEvent(created_at=now, actor=actor, action=action, job_id=job_id,
                                               placement_id=pk, message=message, data=data or {})
                                    for pk, job_id in rows])
    return [pk for pk, _ in rows]


def victim_placements(gains: dict) -> list:
    return [v["placement"] for v in (gains or {}).get("victims", ()) if v.get("placement") is not None]
