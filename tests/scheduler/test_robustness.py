"""What keeps jobs moving when something goes wrong on the way: a job says how it ended
(exit code and reason, on its page and in the list); placements stuck on the way to their
agents (the broker was away when the approval committed, the dispatching worker died) are
sent again by a later cycle task; GPUs busy with work the scheduler does not know are not
offered; a job whose dispatch failed sits out a backoff instead of failing on the same GPUs
every cycle."""
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from pool.models import Gpu
from scheduler import cycle, dispatch, reconcile, services, snapshot, tasks
from scheduler.models import AuditEvent, Job, Placement

from .agents import (  # noqa: F401 - fixtures
    active_gpus,
    agent_settings,
    approve,
    clock,
    eager_tasks,
    poll,
    propose,
    simulator,
    small_cluster,
    submit,
)

# The fixtures come from .agents by name: pytest sees them as redefinitions, ruff as well.
# ruff: noqa: F811
pytestmark = pytest.mark.django_db


def report(host, alloc_id, state, exit_code=None, reason=""):
    from pool.models import Host
    return (Host.objects.get(name=host).pk, host, [{"id": alloc_id, "state": state, "exit_code": exit_code,
                                                    "reason": reason, "started_at": None, "finished_at": None,
                                                    "gpus": []}])


def sent(cluster, tenant, hosts):
    """A placement its agents have (dispatching), every GPU of each host."""
    job = submit(cluster, tenant, 4 * len(hosts))
    placement = propose(job, hosts)
    Placement.objects.filter(pk=placement.pk).update(state=Placement.State.DISPATCHING, dispatched_at=timezone.now())
    Job.objects.filter(pk=job.pk).update(state=Job.State.DISPATCHING)
    return job, placement


def age(placement, seconds):
    """Make the placement, and what the audit log says about it, `seconds` older."""
    delta = timedelta(seconds=seconds)
    placement.refresh_from_db()
    Placement.objects.filter(pk=placement.pk).update(
        created_at=placement.created_at - delta,
        decided_at=placement.decided_at - delta if placement.decided_at else None,
        dispatched_at=placement.dispatched_at - delta if placement.dispatched_at else None)
    for event in AuditEvent.objects.filter(placement=placement):
        AuditEvent.objects.filter(pk=event.pk).update(created_at=event.created_at - delta)


def actions(placement) -> list[str]:
    return list(AuditEvent.objects.filter(placement=placement).order_by("id").values_list("action", flat=True))


@pytest.fixture
def quiet_agents(monkeypatch, eager_tasks):
    """Every agent call is accepted without a network (acks, stops)."""
    monkeypatch.setattr(dispatch, "call_agents", lambda batch, timeout=None: [dispatch.Answer(c.host, 202)
                                                                             for c in batch])


# -- 1. how a job ended ------------------------------------------------------------------------

def test_a_failed_job_keeps_its_exit_code_and_reason_and_shows_them(small_cluster, tenant, viewer, client,
                                                                    quiet_agents, django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0001"])
    done, done_placement = sent(small_cluster, tenant, ["gpu0002"])
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0001", f"p{placement.pk}", "failed", 3, "exited with code 3"),
                                 report("gpu0002", f"p{done_placement.pk}", "succeeded", 0)])
    job.refresh_from_db()
    done.refresh_from_db()
    assert (job.state, job.exit_code, job.message) == (Job.State.FAILED, 3, "gpu0001: exited with code 3")
    assert job.pending_message == ""  # the failure is not a reason to wait
    assert (done.state, done.exit_code, done.message) == (Job.State.SUCCEEDED, 0, "succeeded (exit code 0)")

    client.force_login(viewer)
    page = client.get(reverse("scheduler:job", args=[job.pk])).content.decode()
    assert "How it ended" in page and "gpu0001: exited with code 3" in page and "<code>3</code>" in page
    listing = client.get(reverse("scheduler:jobs")).content.decode()
    assert "exit 3" in listing and "gpu0001: exited with code 3" in listing and "exit 0" in listing


def test_a_cancelled_job_says_who_cancelled_it_and_keeps_its_work_exit_code(
        small_cluster, tenant, operator, quiet_agents, django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0003"])
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_job(job, operator)
    job.refresh_from_db()
    assert (job.state, job.message, job.exit_code) == (Job.State.CANCELLED, "cancelled by alice", None)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0003", f"p{placement.pk}", "stopped", -15, "stopped on request")])
    job.refresh_from_db()
    assert (job.state, job.message, job.exit_code) == (Job.State.CANCELLED, "cancelled by alice", -15)
    assert active_gpus(placement) == 0


# -- 2. stuck placements -----------------------------------------------------------------------

def test_a_placement_approved_while_the_broker_was_away_is_sent_by_a_later_cycle(
        simulator, small_cluster, tenant, operator, eager_tasks, django_capture_on_commit_callbacks):
    job = submit(small_cluster, tenant, 4)
    placement = propose(job, ["gpu0001"])
    with django_capture_on_commit_callbacks(execute=False):  # the dispatch message never left
        services.approve(placement, operator, placement.version)
    alloc = f"p{placement.pk}"

    tasks.allocation_cycle()  # approved just now: its dispatch may still be on the way
    placement.refresh_from_db()
    assert placement.state == Placement.State.APPROVED and simulator.allocation("gpu0001", alloc) is None

    age(placement, 61)  # DISPATCH_STALE_S (60 s) later
    tasks.allocation_cycle()
    placement.refresh_from_db()
    job.refresh_from_db()
    assert placement.state == Placement.State.DISPATCHING and job.state == Job.State.DISPATCHING
    assert simulator.allocation("gpu0001", alloc) is not None
    resend = AuditEvent.objects.get(placement=placement, action="dispatch_resend")
    assert resend.message == "approved over 60 s ago and never sent to its agents: sending it again"

    tasks.allocation_cycle()  # it is on its way now: not sent a third time
    assert actions(placement).count("dispatch_resend") == 1


def test_a_placement_whose_dispatch_worker_died_is_sent_again_and_starts_once(
        simulator, small_cluster, tenant, operator, clock, eager_tasks, django_capture_on_commit_callbacks):
    job = submit(small_cluster, tenant, 8)
    placement = approve(propose(job, ["gpu0001", "gpu0002"]), operator, django_capture_on_commit_callbacks)
    alloc = f"p{placement.pk}"
    first = simulator.allocation("gpu0001", alloc)
    assert placement.state == Placement.State.DISPATCHING and first is not None

    assert dispatch.resend_stuck() == []  # dispatched just now
    age(placement, 61)  # no report and no dispatch activity since
    assert dispatch.resend_stuck() == [placement.pk]
    resend = AuditEvent.objects.get(placement=placement, action="dispatch_resend")
    assert resend.message == "dispatching for over 60 s with no sign of its dispatch: sending it again"
    # The agents already had it: the same work, not a second one.
    assert simulator.allocation("gpu0001", alloc) is first and simulator.allocation("gpu0002", alloc) is not None
    assert actions(placement)[-2:] == ["dispatch_resend", "dispatched"]

    clock.advance(2)
    poll(small_cluster, django_capture_on_commit_callbacks)
    placement.refresh_from_db()
    assert placement.state == Placement.State.RUNNING
    age(placement, 120)
    assert dispatch.resend_stuck() == []  # running placements are never sent again


def test_a_re_send_while_the_broker_is_still_away_is_noted_and_tried_again_later(
        small_cluster, tenant, operator, monkeypatch, django_capture_on_commit_callbacks):
    from kombu.exceptions import OperationalError

    from scheduler import receivers

    class Away:
        def __init__(self, *args):
            pass

        def apply_async(self):
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    monkeypatch.setattr(receivers, "group", Away)
    job = submit(small_cluster, tenant, 4)
    placement = propose(job, ["gpu0001"])
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(placement, operator, placement.version)
    age(placement, 61)
    assert dispatch.resend_stuck() == [placement.pk]
    event = AuditEvent.objects.get(placement=placement, action="dispatch_resend")
    assert "could not be queued (Error 111 connecting" in event.message and "trying again in 60 s" in event.message
    placement.refresh_from_db()
    assert placement.state == Placement.State.APPROVED
    assert dispatch.resend_stuck() == []  # not every cycle: DISPATCH_STALE_S later
    age(placement, 61)
    assert dispatch.resend_stuck() == [placement.pk]


def test_a_cancelled_placement_is_not_sent_again(small_cluster, tenant, operator, quiet_agents,
                                                django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0004"])
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_job(job, operator)
    age(placement, 61)
    assert dispatch.resend_stuck() == []


# -- 3. the dispatch-failure loop ------------------------------------------------------------------

def test_gpus_busy_with_work_nobody_here_knows_are_not_offered(simulator, small_cluster, tenant, clock, operator,
                                                              client, eager_tasks, django_capture_on_commit_callbacks):
    simulator.occupy("gpu0002", 1)
    poll(small_cluster, django_capture_on_commit_callbacks)
    busy = Gpu.objects.get(host__name="gpu0002", index=1)
    assert busy.foreign_busy_until is not None

    taken = snapshot.take()
    free = {g.id for g in taken.snapshot.gpus if g.free}
    assert busy.pk not in free and len(free) == 15
    assert taken.gpus_free == 15
    # An operator picking GPUs by hand sees it too.
    placement = propose(submit(small_cluster, tenant, 4), ["gpu0001"])
    client.force_login(operator)
    page = client.get(reverse("scheduler:override", args=[placement.pk])).content.decode()
    assert page.count("used by work the scheduler does not know") == 1

    # The work ends; once no report shows it for FOREIGN_BUSY_S, the GPU is offered again.
    clock.advance(1001)
    poll(small_cluster, django_capture_on_commit_callbacks)
    assert busy.pk not in {g.id for g in snapshot.take().snapshot.gpus if g.free}
    later = timezone.now() + timedelta(seconds=61)
    assert busy.pk in {g.id for g in snapshot.take(later).snapshot.gpus if g.free}


def test_a_job_whose_dispatch_failed_sits_out_the_backoff_then_avoids_the_busy_gpu(
        simulator, small_cluster, tenant, operator, viewer, client, eager_tasks, settings,
        django_capture_on_commit_callbacks):
    settings.FOREIGN_BUSY_S = 600
    simulator.occupy("gpu0001", 1)  # not yet seen by any poll
    job = submit(small_cluster, tenant, 4)
    failed = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)
    assert failed.state == Placement.State.FAILED
    job.refresh_from_db()
    retry_at = job.expected_start
    assert job.state == Job.State.PENDING and job.pending_reason == "dispatch_failed"
    assert job.message.startswith("dispatch failed: gpu0001 answered 409")
    assert job.pending_message == f"{job.message} (retry after {retry_at:%H:%M:%S})"
    assert 50 <= (retry_at - timezone.now()).total_seconds() <= 61

    client.force_login(viewer)
    page = client.get(reverse("scheduler:job", args=[job.pk])).content.decode()
    assert f"(retry after {retry_at:%H:%M:%S})" in page

    # The next cycles leave it alone until then, with its reason as it was.
    assert cycle.run_cycle().ok
    job.refresh_from_db()
    assert job.state == Job.State.PENDING and job.placements.count() == 1
    assert job.pending_message.endswith(f"(retry after {retry_at:%H:%M:%S})")

    # Meanwhile a poll saw the work on gpu0001; after the backoff the job goes elsewhere
    # (without that, the cycle would pick gpu0001 again: the first of equals).
    poll(small_cluster, django_capture_on_commit_callbacks)
    assert cycle.run_cycle(retry_at + timedelta(seconds=1)).ok
    job.refresh_from_db()
    assert job.state == Job.State.APPROVED
    hosts = set(job.active_placement().gpus.values_list("host__name", flat=True))
    assert hosts and "gpu0001" not in hosts
