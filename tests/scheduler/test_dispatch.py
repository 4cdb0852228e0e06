"""Dispatch against the real agent simulator and against agents that refuse or do not answer:
an approved placement reaches its agents, runs, ends and frees its GPUs; a host that
refuses fails the placement, stops what started elsewhere and puts the job back in the
queue with the reason; a host that does not answer is tried again; a cancel stops the work."""
import asyncio
import json

import pytest
from aiohttp import web

from scheduler import cycle, dispatch, services
from scheduler.models import AuditEvent, Job, Placement

from .agents import (  # noqa: F401 - fixtures
    RunningServer,
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


def actions(placement) -> list[str]:
    return list(AuditEvent.objects.filter(placement=placement).order_by("id").values_list("action", flat=True))


def test_an_approved_placement_runs_on_its_agents_and_frees_its_gpus_when_it_ends(
        simulator, small_cluster, tenant, operator, clock, eager_tasks, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = submit(small_cluster, tenant, 8, env={"WANDB_MODE": "offline"})
    placement = approve(propose(job, ["gpu0001", "gpu0002"]), operator, capture)

    assert placement.state == Placement.State.DISPATCHING
    job.refresh_from_db()
    assert job.state == Job.State.DISPATCHING
    alloc_id = f"p{placement.pk}"
    first, second = simulator.allocation("gpu0001", alloc_id), simulator.allocation("gpu0002", alloc_id)
    assert first is not None and second is not None
    assert len(first.gpu_uuids) == len(second.gpu_uuids) == 4 and first.multi_host
    assert first.end_at - first.requested_at == 60  # the job's estimated run time drives the simulator

    clock.advance(2)  # past the start-up second
    poll(small_cluster, capture)
    placement.refresh_from_db()
    job.refresh_from_db()
    assert placement.state == Placement.State.RUNNING and job.state == Job.State.RUNNING
    assert job.started_at is not None
    assert active_gpus(placement) == 8

    clock.advance(60)  # the work ends by itself
    poll(small_cluster, capture)
    placement.refresh_from_db()
    job.refresh_from_db()
    assert placement.state == Placement.State.FINISHED
    assert job.state == Job.State.SUCCEEDED and job.finished_at is not None
    assert active_gpus(placement) == 0  # free for the next job
    # The agents were told they may forget it: it is no longer in their reports.
    assert simulator.allocation("gpu0001", alloc_id) is None and simulator.acknowledged("gpu0001", alloc_id)
    assert simulator.acknowledged("gpu0002", alloc_id)
    assert actions(placement) == ["approve", "dispatch", "dispatched", "allocation_started", "allocation_started",
                                  "run", "allocation_ended", "allocation_ended", "succeed"]


def test_each_host_gets_its_own_gpus_and_rank(simulator, small_cluster, tenant, operator, eager_tasks,
                                              django_capture_on_commit_callbacks):
    job = submit(small_cluster, tenant, 8, env={"WANDB_MODE": "offline"})
    placement = approve(propose(job, ["gpu0002", "gpu0001"]), operator, django_capture_on_commit_callbacks)
    parts = dispatch.placement_parts(placement.pk)
    requests = dispatch.allocation_requests(job, placement.pk, parts)
    assert [p.host for p in parts] == ["gpu0001", "gpu0002"]
    assert [r["distributed"] for r in requests] == [
        {"master_addr": "gpu0001", "master_port": 29500, "world_size": 8, "node_rank": 0, "nproc_per_node": 4},
        {"master_addr": "gpu0001", "master_port": 29500, "world_size": 8, "node_rank": 1, "nproc_per_node": 4},
    ]
    assert requests[0]["env"] == {"WANDB_MODE": "offline", "FABRICPOOL_JOB_ID": str(job.pk)}
    assert requests[0]["command"] == ["python", "train.py"] and requests[0]["workload"] == "training"
    # What the simulator holds is what was asked, GPU for GPU.
    assert list(simulator.allocation("gpu0002", f"p{placement.pk}").gpu_uuids) == list(parts[1].gpus)


def test_a_host_that_refuses_fails_the_placement_and_the_job_waits_again(
        simulator, small_cluster, tenant, operator, clock, eager_tasks, django_capture_on_commit_callbacks):
    simulator.occupy("gpu0002", 1)  # somebody's work the scheduler does not know about
    job = submit(small_cluster, tenant, 8)
    placement = approve(propose(job, ["gpu0001", "gpu0002"]), operator, django_capture_on_commit_callbacks)

    job.refresh_from_db()
    assert placement.state == Placement.State.FAILED
    assert active_gpus(placement) == 0
    assert job.state == Job.State.PENDING and job.pending_reason == "dispatch_failed"
    assert job.pending_message.startswith("dispatch failed: gpu0002 answered 409: gpus[1]: GPU GPU-")
    assert "is in use by allocation someone-else" in job.pending_message
    assert placement.message == job.message and job.pending_message.startswith(job.message + " (retry after ")
    # gpu0001 had started its part: it was stopped.
    started = simulator.allocation("gpu0001", f"p{placement.pk}")
    assert started is not None and started.stop_at is not None
    clock.advance(5)
    assert started.state(clock()) == "stopped"
    failed = AuditEvent.objects.get(placement=placement, action="dispatch_failed")
    assert (failed.from_state, failed.to_state) == (Job.State.DISPATCHING, Job.State.PENDING)

    # Its stopped part is acknowledged on the next poll and nothing else changes.
    poll(small_cluster, django_capture_on_commit_callbacks)
    placement.refresh_from_db()
    assert placement.state == Placement.State.FAILED
    assert simulator.acknowledged("gpu0001", f"p{placement.pk}")


class FlakyAgent:
    """A one-host agent: the first `hang` POSTs get no answer, the rest are accepted."""

    def __init__(self, hang: int):
        self.hang = hang
        self.bodies = []
        self.deletes = []

    def app(self):
        app = web.Application()
        app.router.add_post("/v1/allocations", self.post)
        app.router.add_delete("/v1/allocations/{id}", self.delete)
        return app

    async def post(self, request):
        self.bodies.append(await request.json())
        self.auth = request.headers.get("Authorization")
        if len(self.bodies) <= self.hang:
            await asyncio.sleep(5)
        return web.json_response({"id": self.bodies[-1]["id"], "state": "starting"},
                                 status=202 if len(self.bodies) == self.hang + 1 else 200)

    async def delete(self, request):
        self.deletes.append(request.match_info["id"])
        return web.json_response({"error": "no such allocation", "path": "id"}, status=404)


@pytest.fixture
def flaky(small_cluster):
    servers = []

    def start(hang):
        agent = FlakyAgent(hang)
        server = RunningServer(agent.app())
        servers.append(server)
        small_cluster.hosts()[0].__class__.objects.filter(name="gpu0001").update(agent_url=server.base)
        return agent
    yield start
    for server in servers:
        server.stop()


def test_an_agent_that_does_not_answer_is_tried_again(flaky, small_cluster, tenant, operator, eager_tasks,
                                                      django_capture_on_commit_callbacks):
    agent = flaky(hang=1)
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)

    assert placement.state == Placement.State.DISPATCHING  # accepted on the second attempt
    assert len(agent.bodies) == 2 and agent.bodies[0] == agent.bodies[1]  # the same request: the agent starts it once
    assert agent.auth == f"Bearer {dispatch.token_for('gpu0001')}"
    retry = AuditEvent.objects.get(placement=placement, action="dispatch_retry")
    assert "gpu0001: no answer within 0.5 s" in retry.message
    assert actions(placement)[-1] == "dispatched"


def test_an_agent_that_never_answers_fails_the_placement_after_the_retries(
        flaky, small_cluster, tenant, operator, eager_tasks, django_capture_on_commit_callbacks):
    agent = flaky(hang=10)
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)

    job.refresh_from_db()
    assert len(agent.bodies) == 3  # DISPATCH_RETRIES = 2 in these tests
    assert placement.state == Placement.State.FAILED and active_gpus(placement) == 0
    assert job.state == Job.State.PENDING
    assert job.message == "dispatch failed: gpu0001: no answer within 0.5 s after 3 attempts"
    assert job.pending_message.startswith(job.message + " (retry after ")
    assert agent.deletes == [f"p{placement.pk}"]  # in case one of the requests got through after all


def test_a_host_without_an_agent_fails_the_job_for_good(small_cluster, tenant, operator, agent_settings, eager_tasks,
                                                        django_capture_on_commit_callbacks):
    small_cluster.hosts()[0].__class__.objects.filter(name="gpu0001").update(agent_kind="none")
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert placement.state == Placement.State.FAILED
    assert job.state == Job.State.FAILED  # back in the queue it would only fail again
    assert job.message == "cannot be dispatched: host gpu0001 has no FabricPool agent to start work"
    assert job.pending_message == ""


def test_dispatching_twice_starts_nothing_twice_and_later_states_are_left_alone(
        simulator, small_cluster, tenant, operator, clock, eager_tasks, django_capture_on_commit_callbacks):
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0003"]), operator, django_capture_on_commit_callbacks)
    before = simulator.allocation("gpu0003", f"p{placement.pk}")

    # The same message delivered again (a worker died before acknowledging it).
    again = dispatch.dispatch_placement.apply(args=[placement.pk]).get()
    assert again == {"state": "sent", "message": "accepted by 1 host"}
    assert simulator.allocation("gpu0003", f"p{placement.pk}") is before
    clock.advance(2)
    poll(small_cluster, django_capture_on_commit_callbacks)
    placement.refresh_from_db()
    assert placement.state == Placement.State.RUNNING
    assert dispatch.dispatch_placement.apply(args=[placement.pk]).get() == {"state": "skipped",
                                                                            "message": "placement is running"}


def test_cancelling_a_running_job_stops_its_work_and_frees_the_gpus_once_stopped(
        simulator, small_cluster, tenant, operator, clock, eager_tasks, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0004"]), operator, capture)
    clock.advance(2)
    poll(small_cluster, capture)

    with capture(execute=True):
        services.cancel_job(job, operator)
    work = simulator.allocation("gpu0004", f"p{placement.pk}")
    assert work.stop_at is not None  # the DELETE arrived
    placement.refresh_from_db()
    assert placement.state == Placement.State.RUNNING and active_gpus(placement) == 4  # still on the GPUs

    clock.advance(2)  # the stop's grace period
    poll(small_cluster, capture)
    placement.refresh_from_db()
    job.refresh_from_db()
    assert placement.state == Placement.State.CANCELLED and active_gpus(placement) == 0
    assert job.state == Job.State.CANCELLED
    assert simulator.acknowledged("gpu0004", f"p{placement.pk}")


def test_cancelling_while_the_agent_never_got_the_work_ends_the_placement(
        flaky, small_cluster, tenant, operator, eager_tasks, django_capture_on_commit_callbacks):
    agent = flaky(hang=0)
    job = submit(small_cluster, tenant, 4)
    placement = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)
    assert placement.state == Placement.State.DISPATCHING
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_job(job, operator)
    # This agent answers 404 to the stop: nothing to wait for, the GPUs are free now.
    placement.refresh_from_db()
    assert agent.deletes == [f"p{placement.pk}"]
    assert placement.state == Placement.State.CANCELLED and active_gpus(placement) == 0


def test_a_cycle_that_approves_by_policy_dispatches_at_once(simulator, small_cluster, tenant, eager_tasks, monkeypatch,
                                                          django_capture_on_commit_callbacks):
    monkeypatch.setattr(cycle, "lock_key", lambda: "fabricpool:test:dispatch-cycle")
    job = submit(small_cluster, tenant, 4)
    with django_capture_on_commit_callbacks(execute=True):
        result = cycle.run_cycle()
    assert result.ok and result.auto_approved == 1
    placement = Placement.objects.get(job=job)
    assert placement.state == Placement.State.DISPATCHING
    host = dispatch.placement_parts(placement.pk)[0].host
    assert simulator.allocation(host, f"p{placement.pk}") is not None


def test_requests_are_refused_before_sending_when_the_job_cannot_be_valid(small_cluster, tenant):
    job = Job.objects.create(tenant=tenant, pool=small_cluster.pool, gpus=1, command=[], task_class="training")
    parts = [dispatch.Part(1, "gpu0001", "http://x", "fabricpool", ("GPU-1",))]
    with pytest.raises(dispatch.DispatchError, match="command: expected a non-empty list"):
        dispatch.allocation_requests(job, 7, parts)
    assert json.dumps(dispatch.allocation_id(7)) == '"p7"' and dispatch.placement_id_of("p7") == 7
    assert dispatch.placement_id_of("job-7") is None and dispatch.placement_id_of("p07") is None
