"""Reconciliation: agent reports move placements and jobs, and free GPUs, exactly when the
work's state says so; multi-host placements wait for every host; reports that belong to no
placement are noted once; the common case (running work) costs one query."""
import pytest
from django.utils import timezone

from scheduler import dispatch, reconcile
from scheduler.models import AuditEvent, Job, Placement

from .agents import active_gpus, agent_settings, eager_tasks, propose, small_cluster, submit  # noqa: F401 - fixtures

# The fixtures come from .agents by name: pytest sees them as redefinitions, ruff as well.
# ruff: noqa: F811
pytestmark = pytest.mark.django_db


class Calls(list):
    answers: dict


@pytest.fixture
def agents(monkeypatch, eager_tasks):
    """Every call to an agent is recorded and accepted (or answered with `answers[host]`)."""
    calls, answers = Calls(), {}

    def call_agents(batch, timeout=None):
        calls.extend((c.method, c.host, c.url.split("/v1/")[1]) for c in batch)
        return [dispatch.Answer(c.host, answers.get(c.host, 202)) for c in batch]
    monkeypatch.setattr(dispatch, "call_agents", call_agents)
    calls.answers = answers
    return calls


def sent(cluster, tenant, hosts, gpus=None, state=Placement.State.DISPATCHING):
    """A placement already sent to these hosts' agents (every GPU of each host)."""
    job = submit(cluster, tenant, gpus or 4 * len(hosts))
    placement = propose(job, hosts)
    Placement.objects.filter(pk=placement.pk).update(state=state, dispatched_at=timezone.now())
    Job.objects.filter(pk=job.pk).update(state=Job.State.DISPATCHING if state == Placement.State.DISPATCHING else state)
    placement.refresh_from_db()
    return job, placement


def host_id(name):
    from pool.models import Host
    return Host.objects.get(name=name).pk


def report(host, alloc_id, state, exit_code=None, reason=""):
    return (host_id(host), host, [{"id": alloc_id, "state": state, "exit_code": exit_code, "reason": reason,
                                   "started_at": None, "finished_at": None, "gpus": []}])


def states(job, placement):
    job.refresh_from_db()
    placement.refresh_from_db()
    return job.state, placement.state


def test_a_multi_host_placement_runs_once_every_host_reports_it(small_cluster, tenant, agents,
                                                                django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0001", "gpu0003"])
    alloc = f"p{placement.pk}"
    # Two poll chunks: one host each.
    reconcile.apply_reports([report("gpu0001", alloc, "running")])
    assert states(job, placement) == (Job.State.DISPATCHING, Placement.State.DISPATCHING)
    reconcile.apply_reports([report("gpu0001", alloc, "running")])  # the same again: nothing new
    reconcile.apply_reports([report("gpu0003", alloc, "starting")])
    assert states(job, placement) == (Job.State.RUNNING, Placement.State.RUNNING)
    assert job.started_at is not None and placement.started_at is not None
    assert AuditEvent.objects.filter(placement=placement, action="allocation_started").count() == 2
    run = AuditEvent.objects.get(placement=placement, action="run")
    assert (run.from_state, run.to_state, run.message) == ("dispatching", "running", "running on gpu0001, gpu0003")


def test_work_that_ends_before_a_poll_saw_it_running_still_counts(small_cluster, tenant, agents,
                                                                   django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0002"])
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0002", f"p{placement.pk}", "succeeded", 0)])
    assert states(job, placement) == (Job.State.SUCCEEDED, Placement.State.FINISHED)
    assert job.started_at is not None and job.finished_at is not None
    assert active_gpus(placement) == 0
    assert agents == [("POST", "gpu0002", f"allocations/p{placement.pk}/ack")]
    assert placement.message == "succeeded (exit code 0)"


def test_one_rank_failing_stops_the_others_and_fails_the_job_with_its_reason(small_cluster, tenant, agents,
                                                                            django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job, placement = sent(small_cluster, tenant, ["gpu0001", "gpu0002"], state=Placement.State.RUNNING)
    alloc = f"p{placement.pk}"
    with capture(execute=True):
        reconcile.apply_reports([report("gpu0001", alloc, "running"),
                                 report("gpu0002", alloc, "failed", 3, "exited with code 3")])
    # gpu0001 is told to stop; the GPUs stay held until it confirms.
    assert ("DELETE", "gpu0001", f"allocations/{alloc}") in agents
    assert ("POST", "gpu0002", f"allocations/{alloc}/ack") in agents
    assert states(job, placement) == (Job.State.RUNNING, Placement.State.RUNNING)
    assert active_gpus(placement) == 8
    assert placement.message == "gpu0002: exited with code 3"

    with capture(execute=True):
        reconcile.apply_reports([report("gpu0001", alloc, "stopped", -15, "stopped on request (SIGTERM)")])
    assert states(job, placement) == (Job.State.FAILED, Placement.State.FAILED)
    assert active_gpus(placement) == 0
    assert job.message == placement.message == "gpu0002: exited with code 3"
    fail = AuditEvent.objects.get(placement=placement, action="fail")
    assert fail.data == {"exit_codes": {"gpu0001": -15, "gpu0002": 3}}


def test_lost_work_fails_the_job(small_cluster, tenant, agents, django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0003"], state=Placement.State.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0003", f"p{placement.pk}", "lost")])
    assert states(job, placement) == (Job.State.FAILED, Placement.State.FAILED)
    assert placement.message == "gpu0003: lost: the agent restarted without it"


def test_work_stopped_on_the_host_by_someone_else_fails_the_job(small_cluster, tenant, agents,
                                                               django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0003"], state=Placement.State.RUNNING)
    reconcile.apply_reports([report("gpu0003", f"p{placement.pk}", "stopped", -9, "killed")])
    assert states(job, placement) == (Job.State.FAILED, Placement.State.FAILED)
    assert placement.message == "gpu0003: killed (exit code -9) (not stopped by the scheduler)"


def test_reports_nobody_knows_are_noted_once(small_cluster, tenant, agents):
    job, placement = sent(small_cluster, tenant, ["gpu0001"])
    strangers = [
        (host_id("gpu0002"), "gpu0002", [{"id": "backup-7", "state": "running"},  # not ours at all
                                         {"id": "p999999", "state": "running"},  # no such placement
                                         {"id": f"p{placement.pk}", "state": "running"}]),  # not a host of it
    ]
    assert reconcile.apply_reports(strangers).unknown == 3
    assert reconcile.apply_reports(strangers).unknown == 0  # every poll round: still one note each
    notes = AuditEvent.objects.filter(action="unknown_allocation").order_by("id")
    assert [n.data["allocation"] for n in notes] == ["backup-7", "p999999", f"p{placement.pk}"]
    assert notes[0].message == ("gpu0002 reports allocation backup-7 (running), which no placement of this "
                                "scheduler holds; it is left alone")
    assert states(job, placement) == (Job.State.DISPATCHING, Placement.State.DISPATCHING)
    assert agents == []  # nobody's work was touched


def test_work_still_running_for_an_ended_placement_is_stopped(small_cluster, tenant, agents,
                                                              django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0004"], state=Placement.State.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0004", f"p{placement.pk}", "running")])
    assert agents == [("DELETE", "gpu0004", f"allocations/p{placement.pk}")]
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0004", f"p{placement.pk}", "stopped")])
    assert agents[-1] == ("POST", "gpu0004", f"allocations/p{placement.pk}/ack")
    assert states(job, placement)[1] == Placement.State.FAILED


def test_a_stop_the_agent_does_not_know_ends_a_cancelled_placement(small_cluster, tenant, agents, operator,
                                                                   django_capture_on_commit_callbacks):
    from scheduler import services
    job, placement = sent(small_cluster, tenant, ["gpu0001", "gpu0002"])
    agents.answers["gpu0002"] = 404  # it never got its part
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_job(job, operator)
    assert states(job, placement) == (Job.State.CANCELLED, Placement.State.DISPATCHING)  # gpu0001 is stopping
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0001", f"p{placement.pk}", "stopped", -15, "stopped on request (SIGTERM)")])
    assert states(job, placement) == (Job.State.CANCELLED, Placement.State.CANCELLED)
    assert active_gpus(placement) == 0


def test_running_work_costs_one_query(small_cluster, tenant, agents, django_assert_num_queries):
    reports = []
    for host in ("gpu0001", "gpu0002", "gpu0003", "gpu0004"):
        _, placement = sent(small_cluster, tenant, [host], state=Placement.State.RUNNING)
        reports.append(report(host, f"p{placement.pk}", "running"))
    reports.append((host_id("gpu0001"), "gpu0001", []))  # a host with nothing on it
    with django_assert_num_queries(1):
        stats = reconcile.apply_reports(reports)
    assert (stats.running, stats.ended, stats.unknown) == (0, 0, 0)


def test_the_first_problem_is_the_reason_not_the_stops_that_followed(small_cluster, tenant, agents,
                                                                     django_capture_on_commit_callbacks):
    job, placement = sent(small_cluster, tenant, ["gpu0001", "gpu0002"], state=Placement.State.RUNNING)
    alloc = f"p{placement.pk}"
    with django_capture_on_commit_callbacks(execute=True):
        reconcile.apply_reports([report("gpu0002", alloc, "stopped", -9, "killed")])
    assert ("DELETE", "gpu0001", f"allocations/{alloc}") in agents
    reconcile.apply_reports([report("gpu0001", alloc, "stopped", -15, "stopped on request (SIGTERM)")])
    assert states(job, placement) == (Job.State.FAILED, Placement.State.FAILED)
    assert placement.message == "gpu0002: killed (exit code -9) (not stopped by the scheduler)"
