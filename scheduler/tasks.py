"""Celery tasks of the scheduler. Beat runs allocation_cycle every CYCLE_INTERVAL (row made
by migration 0002_schedule); a job submission asks for one soon (request_cycle_soon), and
submissions close together share that one: a short-lived Redis key marks a cycle as
already asked for.

Each cycle task first sends dispatch again for placements stuck on the way to their agents
(scheduler.dispatch.resend_stuck).

The cycle's own lock (scheduler.cycle) keeps cycles from overlapping; its time limit is
below the lock's TTL, so a hung cycle is killed before another may start.
"""
from __future__ import annotations

import logging

import redis
from celery import shared_task
from django.conf import settings
from kombu.exceptions import OperationalError

from . import cycle, dispatch

log = logging.getLogger(__name__)

SOON_PREFIX = "fabricpool:scheduler:cycle-soon"


@shared_task(name="scheduler.tasks.allocation_cycle", ignore_result=True, soft_time_limit=40, time_limit=50)
def allocation_cycle() -> dict:
    # Placements stuck on the way to their agents first; a failure here never stops the cycle.
    try:
        dispatch.resend_stuck()
    except Exception:  # noqa: BLE001
        log.exception("could not look for placements stuck in dispatch; the next cycle tries again")
    return cycle.run_cycle().as_dict()


@shared_task(name="scheduler.tasks.expire_proposals", ignore_result=True, soft_time_limit=30, time_limit=40)
def expire_proposals() -> int:
    """Expiry alone (each cycle also expires first); for operators who pause the cycle."""
    return len(cycle.expire_proposals())


def request_cycle_soon() -> bool:
    """Ask for a cycle within CYCLE_SOON_DELAY seconds unless one was asked for already.
    True when this call sent the request. Never raises: if Redis or the broker is away,
    the periodic cycle picks the job up."""
    delay = max(0.0, float(settings.CYCLE_SOON_DELAY))
    key = f"{SOON_PREFIX}:{cycle.lock_key()}"
    try:
        fresh = cycle._redis().set(key, "1", nx=True, px=int((delay + 1.0) * 1000))
        if not fresh:
            return False
        allocation_cycle.apply_async(countdown=delay, expires=delay + float(settings.CYCLE_INTERVAL))
        return True
    except (redis.RedisError, OSError, OperationalError) as exc:
        log.warning("could not ask for an allocation cycle soon (%s); the periodic cycle will run it", exc)
        return False
