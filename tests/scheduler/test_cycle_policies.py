"""Policies through the database: a preemption proposed by the cycle, approved, its victims
stopped and requeued, then its GPUs claimed; remote-site proposals; rebalancing moves
accepted through the stop path; task class rules from the admin over settings; and the
one-active-placement-per-GPU invariant throughout (8 hosts × 4 GPUs, 2 hosts per leaf)."""
from datetime import timedelta

import pytest
from django.db.models import Count
from django.urls import reverse
from django.utils import timezone

from fabric.models import InterSiteLink, Site
from pool.models import GpuRollup, Host, Resolution
from scheduler import cycle, reconcile, services, snapshot
from scheduler.dispatch import allocation_id
from scheduler.models import AuditEvent, Job, Placement, PlacementGpu, PoolPolicy, TaskClassRule, Tenant, TenantQuota

pytestmark = pytest.mark.django_db


def submit(tenant, gpus, **kw):
    return services.submit_job(None, tenant=tenant, pool="main", gpus=gpus, command=["train"], **kw)


def run_all(jobs, started=None):
    """Mark the jobs' approved placements running (as their agents' reports would)."""
    started = started or timezone.now()
    for job in jobs:
        Placement.objects.filter(job=job, state=Placement.State.APPROVED).update(state=Placement.State.RUNNING,
                                                                               started_at=started)
        Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, started_at=started)


def stopped(placement):
    """Its agents report the work stopped (after the SIGTERM of the stop path)."""
    hosts = set(PlacementGpu.objects.filter(placement=placement).values_list("gpu__host_id", "gpu__host__name"))
    reconcile.apply_reports([(hid, name, [{"id": allocation_id(placement.pk), "state": "stopped", "exit_code": -15,
                                           "reason": "stopped on request (SIGTERM)", "started_at": None,
                                           "finished_at": None, "gpus": []}]) for hid, name in hosts], ack=False)


def one_placement_per_gpu():
    return not PlacementGpu.objects.filter(active=True).values("gpu").annotate(n=Count("id")).filter(n__gt=1).exists()


@pytest.fixture
def borrowed_cluster(cluster, tenant, no_dispatch):
    """Tenant "bio" (no guarantee) fills the pool with 8 preemptible 4-GPU jobs on borrowed
    quota; "physics" is guaranteed 16 GPUs."""
    bio = Tenant.objects.create(name="bio")
    TenantQuota.objects.create(tenant=tenant, pool=cluster.pool, guaranteed_gpus=16)
    start = timezone.now() - timedelta(hours=1)
    jobs = []
    for i in range(8):
        job = submit(bio, 4, preemptible=True)
        Job.objects.filter(pk=job.pk).update(created_at=start + timedelta(seconds=i))
        jobs.append(job)
    result = cycle.run_cycle()
    assert result.auto_approved == 8
    assert Placement.objects.filter(borrowed=True).count() == 8
    for i, job in enumerate(jobs):
        run_all([job], started=start + timedelta(minutes=i))
    return jobs


def test_a_tenant_within_its_guarantee_reclaims_gpus_after_approval(cluster, tenant, operator, borrowed_cluster):
    job = submit(tenant, 8)
    result = cycle.run_cycle()
    assert result.ok and result.proposed == 1
    p = Placement.objects.get(job=job)
    assert p.kind == Placement.Kind.PREEMPTION and p.state == Placement.State.PROPOSED
    assert len(p.victims) == 2 and p.leaves == 1 and p.gains["gpus_freed"] == 8
    assert not PlacementGpu.objects.filter(placement=p).exists()  # the victims still hold the GPUs
    assert "Waits for an operator: preemptions in this pool wait" in p.explanation
    victim_placements = {v["placement"] for v in p.gains["victims"]}
    victim_gpus = set(PlacementGpu.objects.filter(placement_id__in=victim_placements, active=True)
                      .values_list("gpu_id", flat=True))
    assert set(p.gains["gpu_ids"]) == victim_gpus
    # Both victims sit under one leaf: the freed GPUs make a one-leaf placement.
    hosts = set(Host.objects.filter(gpus__id__in=victim_gpus).values_list("name", flat=True))
    assert len({cluster.leaf_of(h) for h in hosts}) == 1

    services.approve(p, operator, p.version)
    stopping = Placement.objects.filter(pk__in=victim_placements)
    assert all(v.stop_requested_at and v.message.startswith("preempted by job") for v in stopping)
    assert cycle.claim_preemptions() == []  # the victims have not stopped yet
    assert cycle.run_cycle().ok and one_placement_per_gpu()

    for v in stopping:
        stopped(v)
    for v in Placement.objects.filter(pk__in=victim_placements):
        assert v.state == Placement.State.PREEMPTED
        victim = v.job
        assert (victim.state, victim.pending_reason, victim.preemption_count) == (Job.State.PENDING, "preempted", 1)
        assert AuditEvent.objects.filter(job=victim, action="preempted", to_state=Job.State.PENDING).exists()
    result = cycle.run_cycle()
    assert result.ok
    assert set(PlacementGpu.objects.filter(placement=p, active=True).values_list("gpu_id", flat=True)) == victim_gpus
    assert AuditEvent.objects.filter(placement=p, action="claim").exists()
    assert one_placement_per_gpu()
    # The requeued victims find no room and may not preempt back (same priority, no guarantee).
    assert not Placement.objects.filter(job__tenant__name="bio", kind=Placement.Kind.PREEMPTION).exists()


def test_the_pools_policy_may_approve_preemptions_at_once(cluster, tenant, borrowed_cluster):
    PoolPolicy.objects.create(pool=cluster.pool, manual_for_preemptions=False)
    job = submit(tenant, 4, priority=3)
    assert cycle.run_cycle().auto_approved == 1
    p = Placement.objects.get(job=job)
    assert p.kind == Placement.Kind.PREEMPTION and p.state == Placement.State.APPROVED and len(p.victims) == 1
    victim = Placement.objects.get(pk=p.gains["victims"][0]["placement"])
    # Lowest priority, then youngest: the last bio job started.
    assert victim.job_id == borrowed_cluster[-1].pk and victim.stop_requested_at is not None
    assert AuditEvent.objects.filter(placement=victim, action="preempt", actor="policy").exists()


def test_no_preemption_of_work_that_is_not_preemptible(cluster, tenant, no_dispatch):
    bio = Tenant.objects.create(name="bio")
    TenantQuota.objects.create(tenant=tenant, pool=cluster.pool, guaranteed_gpus=16)
    jobs = [submit(bio, 4) for _ in range(8)]
    cycle.run_cycle()
    run_all(jobs)
    job = submit(tenant, 8, priority=5)
    cycle.run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.PENDING and not Placement.objects.filter(job=job).exists()


def test_a_job_that_waited_at_home_is_proposed_at_another_site(client, cluster, tenant, operator, no_dispatch):
    home, away = Site.objects.create(name="home"), Site.objects.create(name="away")
    hosts = cluster.hosts()
    Host.objects.filter(pk__in=[h.pk for h in hosts[:2]]).update(site=home)
    Host.objects.filter(pk__in=[h.pk for h in hosts[2:]]).update(site=away)
    InterSiteLink.objects.create(site_a=away, site_b=home, latency_ms=12, bandwidth_gbps=200)
    blockers = [submit(tenant, 4, site="home") for _ in range(2)]
    cycle.run_cycle()
    run_all(blockers)
    job = submit(tenant, 8, site="home", allow_remote_site=True, max_wait_s=0)
    stay = submit(tenant, 8, site="home")
    assert cycle.run_cycle().proposed == 1
    p = Placement.objects.get(job=job)
    assert (p.kind, p.site, p.state) == (Placement.Kind.REMOTE, "away", Placement.State.PROPOSED)
    assert p.gains["latency_ms"] == 12 and p.gains["bandwidth_gbps"] == 200 and "12 ms" in p.explanation
    assert "always wait for an operator" in p.explanation
    assert set(PlacementGpu.objects.filter(placement=p).values_list("gpu__host__site__name", flat=True)) == {"away"}
    stay.refresh_from_db()
    assert stay.state == Job.State.PENDING
    assert one_placement_per_gpu()
    client.force_login(operator)
    html = client.get(reverse("scheduler:placement", args=[p.pk])).content.decode()
    assert 'data-kind="remote"' in html and "at site <strong>away</strong> instead of home" in html
    assert "link 12 ms, 200 Gb/s" in html


def test_a_restartable_job_idle_for_hours_is_proposed_for_a_move_and_requeued_when_accepted(
        client, cluster, tenant, operator, no_dispatch, settings):
    settings.REBALANCE_IDLE_S = 3600
    job = submit(tenant, 4, restartable=True)
    busy = submit(tenant, 4)
    cycle.run_cycle()
    started = timezone.now() - timedelta(hours=3)
    run_all([job, busy], started=started)
    for j, util in ((job, 0.0), (busy, 90.0)):
        gpus = PlacementGpu.objects.filter(placement__job=j).values_list("gpu_id", flat=True)
        GpuRollup.objects.bulk_create([
            GpuRollup(gpu_id=g, resolution=Resolution.MINUTE, t=started + timedelta(minutes=m), samples=6,
                      utilization_avg=util, utilization_max=util) for g in gpus for m in range(0, 180, 10)])
    assert cycle.run_cycle().ok
    move = Placement.objects.get(kind=Placement.Kind.REBALANCE)
    old = Placement.objects.get(job=job, kind=Placement.Kind.PLACE)
    assert (move.job_id, move.moves_placement_id, move.state) == (job.pk, old.pk, Placement.State.PROPOSED)
    assert move.gains["why"] == "idle" and move.gains["idle_gpus"] == 4 and "idle for" in move.explanation
    assert cycle.run_cycle().ok and Placement.objects.filter(kind=Placement.Kind.REBALANCE).count() == 1  # not twice
    with pytest.raises(services.NotDecidable):
        services.override(move, operator, [1], move.version)
    client.force_login(operator)
    html = client.get(reverse("scheduler:index")).content.decode()
    assert 'data-kind="rebalance"' in html and f"placement {old.pk}</a> and requeues its job" in html
    assert "gains 4 GPUs idle for" in html

    services.approve(move, operator, move.version)
    move.refresh_from_db()
    old.refresh_from_db()
    assert move.state == Placement.State.FINISHED and old.stop_requested_at is not None
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING  # until its agents confirm the stop
    stopped(old)
    job.refresh_from_db()
    old.refresh_from_db()
    assert (job.state, job.pending_reason, job.preemption_count) == (Job.State.PENDING, "moved", 0)
    assert old.state == Placement.State.PREEMPTED


def test_rejecting_a_move_leaves_the_job_running(cluster, tenant, operator, no_dispatch, settings):
    job = submit(tenant, 4, restartable=True)
    cycle.run_cycle()
    started = timezone.now() - timedelta(hours=2)
    run_all([job], started=started)
    gpus = PlacementGpu.objects.filter(placement__job=job).values_list("gpu_id", flat=True)
    GpuRollup.objects.bulk_create([GpuRollup(gpu_id=g, resolution=Resolution.MINUTE, t=started, samples=6,
                                             utilization_avg=0, utilization_max=0) for g in gpus])
    cycle.run_cycle()
    move = Placement.objects.get(kind=Placement.Kind.REBALANCE)
    services.reject(move, operator, "needed", move.version)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_task_class_rules_come_from_settings_unless_the_admin_has_a_row(db, settings):
    settings.SCHEDULER_TASK_CLASSES = {"rendering": {"leftovers_only": True}, "science": {"requires_fp64": "high"}}
    rules = snapshot.class_rules()
    assert rules["rendering"].leftovers_only and rules["science"].requires_fp64 == "high"
    TaskClassRule.objects.create(task_class="rendering", leftovers_only=False, preemptible=False)
    rules = snapshot.class_rules()
    assert not rules["rendering"].leftovers_only and not rules["rendering"].preemptible
    settings.SCHEDULER_TASK_CLASSES = {"science": {"needs_fp64": "high"}}
    with pytest.raises(ValueError, match="SCHEDULER_TASK_CLASSES.*needs_fp64"):
        snapshot.class_rules()


def test_the_dashboard_shows_what_a_preemption_stops_and_gains(client, cluster, tenant, operator, borrowed_cluster):
    job = submit(tenant, 8)
    cycle.run_cycle()
    p = Placement.objects.get(job=job)
    client.force_login(operator)
    victims = [v["job"] for v in p.gains["victims"]]
    for url in (reverse("scheduler:placement", args=[p.pk]), reverse("scheduler:index")):
        html = client.get(url).content.decode()
        assert 'data-kind="preemption"' in html and "frees 8 GPUs" in html
        assert all(f"job {v}</a>" in html for v in victims)
