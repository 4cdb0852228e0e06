"""The audit log: every job state change and every decision attempt, refused ones too."""
from __future__ import annotations

from django.utils import timezone

from .models import AuditEvent

SCHEDULER, POLICY, SYSTEM = "scheduler", "policy", "system"


def actor_name(user) -> str:
    if user is None:
        return SYSTEM
    if isinstance(user, str):
        return user
    return user.get_username() or f"user {user.pk}"


def record(actor, action: str, *, job=None, placement=None, from_state: str = "", to_state: str = "",
           message: str = "", data: dict | None = None, refused: bool = False) -> AuditEvent:
    """`actor`: a User, or one of SCHEDULER / POLICY / SYSTEM."""
    user = actor if actor is not None and not isinstance(actor, str) and actor.is_authenticated else None
    return AuditEvent.objects.create(
        created_at=timezone.now(), actor=actor_name(actor), user=user, action=action, refused=refused,
        job_id=getattr(job, "pk", job), placement_id=getattr(placement, "pk", placement),
        from_state=from_state or "", to_state=to_state or "", message=message, data=data or {})
