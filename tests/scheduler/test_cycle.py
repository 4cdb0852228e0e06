"""The allocation cycle on a small built fabric (8 hosts × 4 GPUs, 2 hosts per leaf): jobs get
GPUs close together, the pool's policy decides what waits for an operator, waiting jobs say
why, a cycle that fails half-way leaves nothing behind, and only one cycle runs at a time."""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fabric.models import Link, Switch
from pool.models import Host
from scheduler import cycle, services, signals, snapshot
from scheduler.models import AllocationCycle, AuditEvent, Job, Placement, PlacementGpu, PoolPolicy, Tenant

from .conftest import build_cluster

pytestmark = pytest.mark.django_db


def submit(tenant, gpus, pool="main", **kw):
    return services.submit_job(None, tenant=tenant, pool=pool, gpus=gpus, command=["train"], **kw)


def placement_of(job) -> Placement:
    return Placement.objects.filter(job=job).order_by("-id").first()


def hosts_of(job) -> set[str]:
    return set(PlacementGpu.objects.filter(placement__job=job, active=True).values_list("gpu__host__name", flat=True))


def leaves_of(cluster, job) -> set[str]:
    return {cluster.leaf_of(h) for h in hosts_of(job)}


def test_jobs_get_gpus_close_together_and_are_approved_by_default(cluster, tenant):
    one, four, eight = submit(tenant, 1), submit(tenant, 4), submit(tenant, 8)
    result = cycle.run_cycle()
    assert result.ok and result.auto_approved == 3 and result.pending == 0
    assert len(hosts_of(one)) == 1 and len(hosts_of(four)) == 1
    # 8 GPUs: two whole hosts under one leaf switch, not spread over the fabric.
    assert len(hosts_of(eight)) == 2 and len(leaves_of(cluster, eight)) == 1
    p = placement_of(eight)
    assert (p.hosts, p.leaves, p.pod_crossings, p.lower_bound_leaves) == (2, 1, 0, 1)
    assert "one leaf switch" in p.explanation
    for job in (one, four, eight):
        job.refresh_from_db()
        assert job.state == Job.State.APPROVED
        assert placement_of(job).decided_by_name == "policy"
    # Each job's state changes are in the audit log: submitted, then approved by the policy
    # (proposed and approved in one transaction: never seen proposed).
    assert list(AuditEvent.objects.filter(job=eight).order_by("id").values_list(
        "actor", "action", "from_state", "to_state")) == [
        ("system", "submit", "", "pending"), ("policy", "approve", "pending", "approved")]
    row = AllocationCycle.objects.get(pk=result.cycle_id)
    assert (row.jobs_queued, row.auto_approved, row.gpus_total, row.gpus_free) == (3, 3, 32, 32)
    assert row.finished_at and row.snapshot_s is not None and row.plan_s is not None and row.persist_s is not None


def test_approved_placements_are_announced_after_commit(cluster, tenant, django_capture_on_commit_callbacks, no_dispatch):
    job = submit(tenant, 2)
    seen = []

    def receiver(sender, placement_ids, **kw):
        seen.append(placement_ids)

    signals.placements_approved.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            cycle.run_cycle()
    finally:
        signals.placements_approved.disconnect(receiver)
    assert seen == [[placement_of(job).pk]]


def test_threshold_policy_leaves_big_jobs_for_an_operator(cluster, tenant):
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.THRESHOLD, threshold_gpus=4)
    small, big = submit(tenant, 4), submit(tenant, 8)
    before = timezone.now()
    result = cycle.run_cycle()
    assert (result.auto_approved, result.proposed) == (1, 1)
    small.refresh_from_db()
    big.refresh_from_db()
    assert small.state == Job.State.APPROVED
    assert big.state == Job.State.PROPOSED
    p = placement_of(big)
    assert p.state == Placement.State.PROPOSED and p.decided_at is None
    assert before + timedelta(seconds=299) < p.expires_at < timezone.now() + timedelta(seconds=301)
    assert "above this pool's threshold of 4" in p.explanation
    # Its GPUs are held while it waits: the next cycle does not hand them out again.
    other = submit(tenant, 8)
    cycle.run_cycle()
    assert not hosts_of(other) & hosts_of(big)


def test_manual_policy_for_jobs_crossing_pods(db, tenant):
    cluster = build_cluster(fabric="three", spines=4, leaves=4, hosts_per_leaf=2, gpus=4, pods=2)
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.AUTO, manual_when_crossing_spines=True)
    inside, across = submit(tenant, 16), submit(tenant, 16)  # a pod holds 16 GPUs
    cycle.run_cycle()
    inside.refresh_from_db()
    across.refresh_from_db()
    assert inside.state == Job.State.APPROVED and placement_of(inside).pod_crossings == 0
    # The second 16 fits in the other pod, also without crossing.
    assert across.state == Job.State.APPROVED
    wide = submit(tenant, 24)
    cycle.run_cycle()  # nothing free: waits
    wide.refresh_from_db()
    assert wide.state == Job.State.PENDING
    services.cancel_job(inside, _admin())
    services.cancel_job(across, _admin())
    cycle.run_cycle()
    wide.refresh_from_db()
    p = placement_of(wide)
    assert p.pod_crossings == 1 and wide.state == Job.State.PROPOSED
    assert "spans 2 pods" in p.explanation


def _admin():
    from django.contrib.auth.models import User
    return User.objects.get_or_create(username="root", defaults={"is_superuser": True})[0]


def test_waiting_jobs_say_why(cluster, tenant):
    huge = submit(tenant, 64)
    wrong_model = submit(tenant, 1, gpu_models=["MI300X"])
    fill = submit(tenant, 32, priority=10)
    later = submit(tenant, 4)
    result = cycle.run_cycle()
    for job in (huge, wrong_model, later, fill):
        job.refresh_from_db()
    assert fill.state == Job.State.APPROVED
    assert (huge.state, huge.pending_reason) == (Job.State.PENDING, "constraints")
    assert huge.pending_message == "It needs 64 GPUs; pool main has only 32 GPUs matching its request."
    assert wrong_model.pending_reason == "constraints" and "MI300X" in wrong_model.pending_message
    # It fitted when the cycle began; the higher-priority job took the room.
    assert later.pending_reason == "priority"
    assert result.pending_reasons == {"constraints": 2, "priority": 1}
    assert AllocationCycle.objects.get(pk=result.cycle_id).pending_reasons == {"constraints": 2, "priority": 1}
    cycle.run_cycle()
    later.refresh_from_db()
    assert later.pending_reason == "resources" and later.state == Job.State.PENDING


def test_unchanged_reasons_are_not_rewritten(cluster, tenant):
    submit(tenant, 64)

    def job_updates():
        with CaptureQueriesContext(connection) as queries:
            cycle.run_cycle()
        return [q for q in queries.captured_queries if 'UPDATE "scheduler_job"' in q["sql"]]

    assert job_updates()  # the first cycle writes its reason
    assert not job_updates()


def test_nothing_is_half_written_when_persist_fails(cluster, tenant, monkeypatch):
    jobs = [submit(tenant, 4), submit(tenant, 64)]
    before = list(Job.objects.order_by("id").values_list("state", "pending_reason", "pending_message"))

    def boom(taken):
        raise RuntimeError("worker lost mid-persist")

    # Usage is updated after proposals, their GPUs, job states and audit events are written.
    monkeypatch.setattr(cycle, "_update_usage", boom)
    result = cycle.run_cycle()
    assert not result.ok and "worker lost mid-persist" in result.error
    assert not Placement.objects.exists() and not PlacementGpu.objects.exists()
    assert list(Job.objects.order_by("id").values_list("state", "pending_reason", "pending_message")) == before
    assert not AuditEvent.objects.exclude(action="submit").exists()
    failed = AllocationCycle.objects.get()
    assert "worker lost mid-persist" in failed.error and failed.proposed == 0
    # The next cycle starts cleanly.
    monkeypatch.undo()
    assert cycle.run_cycle().ok
    assert placement_of(jobs[0]).state == Placement.State.APPROVED


def test_a_cycle_is_skipped_while_another_holds_the_lock(cluster, tenant):
    job = submit(tenant, 1)
    redis = cycle._redis()
    redis.set(cycle.lock_key(), "someone-else", px=10_000)
    try:
        result = cycle.run_cycle()
    finally:
        redis.delete(cycle.lock_key())
    assert not result.ok and result.skipped == "another cycle is running"
    assert not AllocationCycle.objects.exists() and not Placement.objects.exists()
    job.refresh_from_db()
    assert job.state == Job.State.PENDING
    assert cycle.run_cycle().ok  # released: the next one runs


def test_proposals_expire_and_their_jobs_are_proposed_again(cluster, tenant):
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)
    job = submit(tenant, 4)
    cycle.run_cycle()
    first = placement_of(job)
    result = cycle.run_cycle(now=timezone.now() + timedelta(seconds=301))
    first.refresh_from_db()
    assert result.expired == 1 and first.state == Placement.State.EXPIRED
    assert not first.placement_gpus.filter(active=True).exists()
    second = placement_of(job)
    assert second.pk != first.pk and second.state == Placement.State.PROPOSED
    assert AuditEvent.objects.filter(job=job, action="expire", actor="system", to_state="pending").exists()


def test_hosts_that_do_not_offer_gpus_get_no_work(cluster, tenant):
    Host.objects.filter(name__in=["gpu0001", "gpu0002", "gpu0003"]).update(state=Host.State.UNREACHABLE)
    Host.objects.filter(name="gpu0004").update(state=Host.State.DRAINING)
    Host.objects.filter(name="gpu0005").update(agent_kind=Host.AgentKind.DCGM)
    jobs = [submit(tenant, 4) for _ in range(4)]
    cycle.run_cycle()
    used = set().union(*(hosts_of(j) for j in jobs))
    assert used == {"gpu0006", "gpu0007", "gpu0008"}
    waiting = Job.objects.get(pk=jobs[-1].pk)
    # Three hosts offer GPUs: the fourth job fitted at the start of the cycle, the three ahead took them.
    assert waiting.state == Job.State.PENDING and waiting.pending_reason == "priority"


def test_running_placements_keep_their_gpus(cluster, tenant):
    running = Job.objects.create(tenant=tenant, pool=cluster.pool, gpus=4, command=["x"], state=Job.State.RUNNING)
    p = Placement.objects.create(job=running, state=Placement.State.RUNNING, started_at=timezone.now())
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=p, gpu_id=g) for g in cluster.gpus("gpu0001")])
    jobs = [submit(tenant, 4) for _ in range(7)]
    cycle.run_cycle()
    assert all(hosts_of(j) and "gpu0001" not in hosts_of(j) for j in jobs)


def test_leaf_health_comes_from_its_uplinks_and_steers_jobs_away(cluster, tenant):
    leaf = Switch.objects.get(description="leaf001")
    uplinks = Link.objects.filter(kind=Link.Kind.SWITCH_SWITCH, port_a__switch=leaf) | \
        Link.objects.filter(kind=Link.Kind.SWITCH_SWITCH, port_b__switch=leaf)
    assert uplinks.count() == 2
    uplinks.filter(pk=uplinks.first().pk).update(state=Link.State.DOWN)
    penalties = {leaf.name: leaf.health_penalty for leaf in snapshot.take().snapshot.leaves}
    assert penalties == {"leaf001": 0.5, "leaf002": 0.0, "leaf003": 0.0, "leaf004": 0.0}
    job = submit(tenant, 4)
    cycle.run_cycle()
    assert leaves_of(cluster, job) != {"leaf001"}


def test_snapshot_queries_do_not_grow_with_the_cluster(db, tenant):
    build_cluster(fabric="small", pool="small", leaves=2, hosts_per_leaf=2)
    for _ in range(3):
        submit(tenant, 1, pool="small")
    with CaptureQueriesContext(connection) as small:
        snapshot.take()
    build_cluster(fabric="large", pool="large", spines=4, leaves=8, hosts_per_leaf=4)
    for _ in range(30):
        submit(tenant, 2, pool="large")
    with CaptureQueriesContext(connection) as large:
        taken = snapshot.take()
    assert len(large.captured_queries) == len(small.captured_queries)
    # (Host names are cluster-wide: the large fabric's gpu0001-0004 are the small one's hosts.)
    assert len(taken.snapshot.gpus) == 32 * 4 and len(taken.snapshot.queue) == 33


def test_usage_counts_running_gpu_seconds(cluster, tenant):
    job = Job.objects.create(tenant=tenant, pool=cluster.pool, gpus=4, command=["x"], state=Job.State.RUNNING)
    p = Placement.objects.create(job=job, state=Placement.State.RUNNING, started_at=timezone.now())
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=p, gpu_id=g) for g in cluster.gpus("gpu0001")])
    t0 = timezone.now()
    cycle.run_cycle(now=t0)
    cycle.run_cycle(now=t0 + timedelta(seconds=100))
    tenant.refresh_from_db()
    # 4 GPUs for 100 s, decayed a little (half-life 24 h).
    assert 399 < tenant.usage_gpu_seconds <= 400
    assert Tenant.objects.get(pk=tenant.pk).usage_updated_at == t0 + timedelta(seconds=100)
