"""Every decision path of scheduler.services on a small built fabric (8 hosts × 4 GPUs): approve,
reject, override (good and bad), cancel in each state, expiry, submission; viewers and
stale pages are refused with a clear sentence, nothing changes, and every attempt is audited."""
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import CommandError, call_command
from django.utils import timezone

from pool.models import Gpu, Host, Pool
from scheduler import cycle, services, signals, tasks
from scheduler.models import AuditEvent, Job, Placement, PlacementGpu, PoolPolicy, Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def manual(cluster):
    return PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)


def propose(tenant, gpus=4, **kw) -> Placement:
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=gpus, command=["train"], **kw)
    cycle.run_cycle()
    return Placement.objects.get(job=job, state=Placement.State.PROPOSED)


def active_gpus(p: Placement) -> list[int]:
    return sorted(PlacementGpu.objects.filter(placement=p, active=True).values_list("gpu_id", flat=True))


def state(obj):
    obj.refresh_from_db()
    return obj.state


def refused(action) -> list[tuple]:
    return list(AuditEvent.objects.filter(action=action, refused=True).values_list("actor", "message"))


# -- approve -------------------------------------------------------------------------------------

def test_approve(manual, tenant, operator, django_capture_on_commit_callbacks, no_dispatch):
    p = propose(tenant)
    seen = []
    signals.placements_approved.connect(lambda sender, placement_ids, **kw: seen.append(placement_ids), weak=False,
                                        dispatch_uid="test-approve")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.approve(p, operator, expected_version=p.version)
    finally:
        signals.placements_approved.disconnect(dispatch_uid="test-approve")
    p.refresh_from_db()
    assert (p.state, p.decided_by, p.decided_by_name, p.version, p.expires_at) == (
        Placement.State.APPROVED, operator, "alice", 2, None)
    assert state(p.job) == Job.State.APPROVED
    assert seen == [[p.pk]]
    assert AuditEvent.objects.filter(action="approve", actor="alice", refused=False, placement=p,
                                     from_state="proposed", to_state="approved").exists()


def test_viewers_cannot_decide(manual, tenant, viewer):
    p = propose(tenant)
    for call in (lambda: services.approve(p, viewer, p.version), lambda: services.reject(p, viewer, "no", p.version),
                 lambda: services.override(p, viewer, active_gpus(p), p.version)):
        with pytest.raises(PermissionDenied, match="vera may not"):
            call()
    assert state(p) == Placement.State.PROPOSED and p.version == 1
    assert [a for a, _ in refused("approve") + refused("reject") + refused("override")] == ["vera"] * 3


def test_a_stale_page_is_told_what_changed(manual, tenant, operator, operator2):
    p = propose(tenant)
    services.approve(p, operator, expected_version=1)
    with pytest.raises(services.ChangedUnderYou) as error:
        services.reject(p, operator2, "too big", expected_version=1)
    at = timezone.localtime(Placement.objects.get(pk=p.pk).decided_at).strftime("%H:%M")
    assert str(error.value) == (f"Placement {p.pk} changed under you: it is now approved by alice at {at}. "
                                "Look at it again before deciding.")
    assert state(p) == Placement.State.APPROVED and active_gpus(p)
    assert refused("reject") == [("bob", str(error.value))]


def test_only_proposals_are_decidable(manual, tenant, operator):
    p = propose(tenant)
    services.approve(p, operator, expected_version=1)
    with pytest.raises(services.NotDecidable, match="it is approved by alice at .*only proposed placements"):
        services.approve(p, operator, expected_version=2)


# -- reject --------------------------------------------------------------------------------------

def test_reject_frees_the_gpus_and_requeues_the_job(manual, tenant, operator):
    p = propose(tenant)
    gpus = active_gpus(p)
    services.reject(p, operator, "  that rack is being serviced ", expected_version=1)
    p.refresh_from_db()
    assert (p.state, p.reject_reason, p.decided_by_name) == (Placement.State.REJECTED, "that rack is being serviced",
                                                             "alice")
    assert not active_gpus(p)
    job = p.job
    job.refresh_from_db()
    assert (job.state, job.pending_reason, job.pending_message) == (
        Job.State.PENDING, "rejected", "Rejected by alice: that rack is being serviced.")
    # The GPUs are free again: another job may have them.
    other = propose(tenant)
    assert set(active_gpus(other)) & set(gpus) or len(set(active_gpus(other))) == 4
    assert AuditEvent.objects.filter(action="reject", job=job, from_state="proposed", to_state="pending").exists()


# -- override ------------------------------------------------------------------------------------

def test_override_stores_both_choices_and_is_approved(manual, tenant, operator, cluster):
    p = propose(tenant)
    proposed, proposed_cost = active_gpus(p), p.cost_dict()
    host = next(h.name for h in cluster.hosts() if set(cluster.gpus(h.name)) != set(proposed))
    chosen = cluster.gpus(host)
    services.override(p, operator, chosen, expected_version=1)
    p.refresh_from_db()
    assert p.is_override and p.state == Placement.State.APPROVED and p.decided_by_name == "alice"
    assert p.proposed_gpus == proposed and p.proposed_cost == proposed_cost
    assert active_gpus(p) == sorted(chosen)
    assert (p.hosts, p.leaves) == (1, 1) and p.overridden_by == operator
    event = AuditEvent.objects.get(action="override", refused=False)
    assert event.data["chosen_gpus"] == chosen and event.data["proposed_gpus"] == proposed
    assert state(p.job) == Job.State.APPROVED
    approval = AuditEvent.objects.get(action="approve", refused=False)
    assert (approval.from_state, approval.to_state) == (Job.State.PROPOSED, Job.State.APPROVED)


def test_an_override_may_wait_for_a_second_decision(manual, tenant, operator, operator2, cluster):
    manual.manual_for_overrides = True
    manual.save()
    p = propose(tenant, gpus=8)
    spread = cluster.gpus("gpu0001") + cluster.gpus("gpu0008")  # two leaves instead of one
    services.override(p, operator, spread, expected_version=1)
    p.refresh_from_db()
    assert p.state == Placement.State.PROPOSED and p.version == 2 and p.is_override
    assert (p.leaves, p.proposed_cost["leaves"]) == (2, 1)
    assert p.expires_at is not None
    with pytest.raises(services.ChangedUnderYou, match="it is now an override by alice"):
        services.approve(p, operator2, expected_version=1)
    services.approve(p, operator2, expected_version=2)
    assert state(p) == Placement.State.APPROVED and p.decided_by_name == "bob"


def test_an_override_breaking_the_rules_is_refused_and_changes_nothing(manual, tenant, operator, cluster):
    p = propose(tenant, min_memory_mib=1000)
    before = active_gpus(p)
    Gpu.objects.filter(pk=cluster.gpus("gpu0005")[0]).update(memory_mib=500)
    wrong = cluster.gpus("gpu0005")[:3]  # 3 GPUs for a 4-GPU gang job, one too small
    with pytest.raises(services.InvalidOverride) as error:
        services.override(p, operator, wrong, expected_version=1)
    assert "The job needs exactly 4 GPUs (gang); 3 were chosen." in error.value.problems
    assert "GPU gpu0005/0 has 500 MiB, less than 1000 MiB." in error.value.problems
    assert str(error.value).startswith("The chosen GPUs break the job's rules: ")
    assert active_gpus(p) == before and state(p) == Placement.State.PROPOSED and p.version == 1
    assert refused("override")[0][0] == "alice"


def test_an_override_onto_gpus_of_another_placement_is_refused(manual, tenant, operator, cluster):
    first, second = propose(tenant), propose(tenant)
    with pytest.raises(services.GpusTaken, match=f"is held by job {first.job_id} \\(proposed\\)"):
        services.override(second, operator, active_gpus(first), expected_version=1)
    assert state(second) == Placement.State.PROPOSED and active_gpus(second)


def test_an_override_onto_a_host_in_another_pool_is_refused(manual, tenant, operator, cluster):
    other = Pool.objects.create(name="other")
    Host.objects.filter(name="gpu0008").update(pool=other)
    p = propose(tenant)
    with pytest.raises(services.InvalidOverride, match="is in pool other, not main"):
        services.override(p, operator, cluster.gpus("gpu0008"), expected_version=1)
    with pytest.raises(services.InvalidOverride, match="names no GPUs"):
        services.override(p, operator, ["x"], expected_version=1)


# -- cancel --------------------------------------------------------------------------------------

def test_cancel_a_pending_job(cluster, tenant, operator):
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=4, command=["x"])
    services.cancel_job(job, operator)
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.finished_at
    cycle.run_cycle()
    assert not Placement.objects.filter(job=job).exists()
    assert AuditEvent.objects.filter(action="cancel", job=job, from_state="pending", to_state="cancelled").exists()


@pytest.mark.parametrize("approve_first", [False, True])
def test_cancel_a_proposed_or_approved_job_frees_its_gpus(manual, tenant, operator, approve_first):
    p = propose(tenant)
    if approve_first:
        services.approve(p, operator, 1)
    services.cancel_job(p.job, operator)
    p.refresh_from_db()
    assert p.state == Placement.State.CANCELLED and not active_gpus(p)
    assert state(p.job) == Job.State.CANCELLED


@pytest.mark.parametrize("placement_state", [Placement.State.DISPATCHING, Placement.State.RUNNING])
def test_cancel_a_running_job_asks_its_agents_to_stop(manual, tenant, operator, placement_state,
                                                      django_capture_on_commit_callbacks, no_dispatch):
    p = propose(tenant)
    services.approve(p, operator, 1)
    Placement.objects.filter(pk=p.pk).update(state=placement_state)
    Job.objects.filter(pk=p.job_id).update(state=placement_state)
    gpus = active_gpus(p)
    stops = []
    signals.placements_stop_requested.connect(lambda sender, placement_ids, **kw: stops.append(placement_ids),
                                              weak=False, dispatch_uid="test-stop")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.cancel_job(p.job, operator)
    finally:
        signals.placements_stop_requested.disconnect(dispatch_uid="test-stop")
    p.refresh_from_db()
    # The work may still be on the GPUs: they stay held until the agents confirm it stopped.
    assert p.state == placement_state and p.stop_requested_at is not None and active_gpus(p) == gpus
    assert state(p.job) == Job.State.CANCELLED
    assert stops == [[p.pk]]


@pytest.mark.parametrize("final", [Job.State.SUCCEEDED, Job.State.FAILED, Job.State.CANCELLED])
def test_finished_jobs_cannot_be_cancelled(cluster, tenant, operator, final):
    job = Job.objects.create(tenant=tenant, pool=cluster.pool, gpus=1, command=["x"], state=final)
    with pytest.raises(services.NotCancellable, match=f"already {final}"):
        services.cancel_job(job, operator)
    assert refused("cancel")[0][0] == "alice"


def test_viewers_cannot_cancel(cluster, tenant, viewer):
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=1, command=["x"])
    with pytest.raises(PermissionDenied):
        services.cancel_job(job, viewer)
    assert state(job) == Job.State.PENDING and refused("cancel")[0][0] == "vera"


# -- expiry --------------------------------------------------------------------------------------

def test_an_undecided_proposal_expires(manual, tenant, operator):
    p = propose(tenant)
    assert cycle.expire_proposals(timezone.now() + timedelta(seconds=299)) == []
    assert cycle.expire_proposals(timezone.now() + timedelta(seconds=301)) == [p.pk]
    p.refresh_from_db()
    assert p.state == Placement.State.EXPIRED and not active_gpus(p) and p.version == 2
    job = p.job
    job.refresh_from_db()
    assert (job.state, job.pending_reason) == (Job.State.PENDING, "expired")
    assert "nobody decided within 5 min" in job.pending_message
    with pytest.raises(services.NotDecidable, match="it is expired at"):
        services.approve(p, operator, expected_version=2)


# -- submission ----------------------------------------------------------------------------------

def test_submit_validates_and_names_each_problem(cluster, tenant, operator):
    with pytest.raises(ValidationError) as error:
        services.submit_job(operator, tenant="nobody", pool="main", gpus=0, command=[], env={"1BAD": "x"},
                            fp64="medium", estimated_runtime_s=100, max_runtime_s=50)
    problems = error.value.message_dict
    assert problems["tenant"] == ["no tenant named 'nobody'; known: physics"]
    assert problems["gpus"] == ["must be between 1 and 100000"]
    assert "argv" in problems["command"][0] and "NAME=value" in problems["env"][0]
    assert "high, low" in problems["fp64"][0]
    assert problems["estimated_runtime_s"] == ["100 s is longer than the maximum run time 50 s"]
    assert not Job.objects.exists()


def test_submit_queues_and_asks_for_a_cycle_soon(cluster, tenant, operator, monkeypatch,
                                                 django_capture_on_commit_callbacks):
    asked = []
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: asked.append(1))
    with django_capture_on_commit_callbacks(execute=True):
        job = services.submit_job(operator, tenant="physics", pool="main", gpus="8", command=["python", "t.py"],
                                  env={"EPOCHS": "3"}, gpu_models=["H100"], max_leaves=1, topology_hard=True)
    assert (job.state, job.gpus, job.submitted_by, job.max_leaves) == (Job.State.PENDING, 8, operator, 1)
    assert asked == [1]
    assert AuditEvent.objects.filter(job=job, action="submit", actor="alice", to_state="pending").exists()


def test_viewers_cannot_submit(cluster, tenant, viewer):
    with pytest.raises(PermissionDenied):
        services.submit_job(viewer, tenant=tenant, pool="main", gpus=1, command=["x"])


def test_cycle_requests_are_coalesced(db, monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.allocation_cycle, "apply_async", lambda **kw: sent.append(kw))
    key = f"{tasks.SOON_PREFIX}:{cycle.lock_key()}"
    cycle._redis().delete(key)
    try:
        assert tasks.request_cycle_soon() is True
        assert tasks.request_cycle_soon() is False
        assert len(sent) == 1 and sent[0]["countdown"] == 1.0
    finally:
        cycle._redis().delete(key)


def test_submit_job_command(cluster, tenant, capsys, monkeypatch):
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: None)
    call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "8", "--model", "H100",
                 "--estimated-runtime", "3600", "--max-leaves", "1", "--max-wait", "300", "--name", "bert",
                 "--env", "EPOCHS=3", "--", "python", "train.py", "--lr", "0.1")
    job = Job.objects.get()
    assert capsys.readouterr().out.strip() == f"job {job.pk} pending: 8 GPUs in pool main for tenant physics"
    assert (job.command, job.env, job.gpu_models, job.max_leaves, job.topology_hard, job.max_wait_s, job.name) == (
        ["python", "train.py", "--lr", "0.1"], {"EPOCHS": "3"}, ["H100"], 1, False, 300, "bert")


def test_submit_job_command_errors(cluster, tenant, monkeypatch):
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: None)
    with pytest.raises(CommandError, match="no pool named 'gpu'; known pools: main"):
        call_command("submit_job", "--tenant", "physics", "--pool", "gpu", "--gpus", "1", "--", "x")
    with pytest.raises(CommandError, match="no tenant named 'bio'; known tenants: physics .--create-tenant"):
        call_command("submit_job", "--tenant", "bio", "--pool", "main", "--gpus", "1", "--", "x")
    with pytest.raises(CommandError, match="job not submitted: gpus: must be between 1 and 100000"):
        call_command("submit_job", "--tenant", "bio", "--create-tenant", "--pool", "main", "--gpus", "0", "--", "x")
    assert not Tenant.objects.filter(name="bio").exists()  # refused job: the tenant made for it is not kept
    with pytest.raises(CommandError, match="give the command to run after --"):
        call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "1")
    call_command("submit_job", "--tenant", "bio", "--create-tenant", "--pool", "main", "--gpus", "1", "--", "x")
    assert Job.objects.get().tenant.name == "bio"


# -- admin ---------------------------------------------------------------------------------------

def test_admin_decides_through_the_services(manual, tenant, client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    root = User.objects.create_superuser("root", password="unused-password-1")
    client.force_login(root)
    p = propose(tenant)
    for name in ("tenant", "poolpolicy", "job", "placement", "allocationcycle", "auditevent"):
        assert client.get(reverse(f"admin:scheduler_{name}_changelist")).status_code == 200
    assert client.get(reverse("admin:scheduler_placement_change", args=[p.pk])).status_code == 200
    response = client.post(reverse("admin:scheduler_placement_changelist"),
                           {"action": "approve", "_selected_action": [p.pk]}, follow=True)
    assert "Approved 1." in response.content.decode()
    assert state(p) == Placement.State.APPROVED and p.decided_by_name == "root"
    # A second approval is refused with the reason, not a traceback.
    response = client.post(reverse("admin:scheduler_placement_changelist"),
                           {"action": "approve", "_selected_action": [p.pk]}, follow=True)
    assert "is not decidable: it is approved by root" in response.content.decode()
