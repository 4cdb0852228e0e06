"""What the scheduler does when something happens elsewhere. Connected in SchedulerConfig.ready.

The scheduler's own signals are sent after their transaction commits, so these send the
Celery tasks straight away; the pool's allocations_reported comes after a poll chunk
commits, and reconciliation runs right there, in the poll worker (a query or two when
nothing changed).
"""
import logging

from celery import group

from . import dispatch, reconcile

log = logging.getLogger(__name__)


def dispatch_approved(sender, placement_ids, **kwargs):
    # One group: the messages go out over one producer connection, not one each
    # (a full-size cycle approves thousands of placements).
    if placement_ids:
        group(dispatch.dispatch_placement.s(pk) for pk in placement_ids).apply_async()


def stop_requested(sender, placement_ids, **kwargs):
    if placement_ids:
        group(dispatch.stop_placement.s(pk) for pk in placement_ids).apply_async()


def allocations_reported(sender, reports, **kwargs):
    stats = reconcile.apply_reports(reports)
    if stats.running or stats.ended or stats.unknown:
        log.info("agent reports: %s placements running, %s ended, %s unknown allocations",
                 stats.running, stats.ended, stats.unknown)
    return stats


def connect():
    from pool import signals as pool_signals

    from . import signals

    signals.placements_approved.connect(dispatch_approved, dispatch_uid="scheduler.dispatch_approved")
    signals.placements_stop_requested.connect(stop_requested, dispatch_uid="scheduler.stop_requested")
    pool_signals.allocations_reported.connect(allocations_reported, dispatch_uid="scheduler.allocations_reported")
