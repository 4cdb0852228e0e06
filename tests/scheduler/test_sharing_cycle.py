"""GPU sharing through the allocation cycle and the database: two fractional jobs share one
GPU (PlacementGpu.share_milli), a whole-GPU job is refused on it, the snapshot reports the
partly used GPU, and persist re-checks shares under the GPU row lock."""
import pytest

from scheduler import cycle, dispatch, engine, services, snapshot
from scheduler.models import Job, PlacementGpu

from .conftest import build_cluster

pytestmark = pytest.mark.django_db


def submit(tenant, gpus=1, **fraction):
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=gpus, command=["serve"])
    if fraction:
        Job.objects.filter(pk=job.pk).update(**fraction)
    return job


@pytest.fixture
def one_gpu(db):
    return build_cluster(fabric="share", leaves=1, hosts_per_leaf=1, gpus=1)


def state(job):
    job.refresh_from_db()
    return job.state


def test_two_fractions_share_a_gpu_and_a_whole_job_is_refused_on_it(one_gpu, tenant, no_dispatch):
    a = submit(tenant, gpu_milli=600, gpu_memory_mib=1000)
    b = submit(tenant, gpu_milli=300)
    whole = submit(tenant)
    result = cycle.run_cycle()
    assert result.ok, result.error
    rows = list(PlacementGpu.objects.filter(active=True).order_by("share_milli").values_list(
        "placement__job_id", "gpu_id", "share_milli", "memory_mib"))
    gpu = one_gpu.gpus("gpu0001")[0]
    assert rows == [(b.pk, gpu, 300, 0), (a.pk, gpu, 600, 1000)]
    assert state(a) == state(b) == Job.State.APPROVED
    assert state(whole) == Job.State.PENDING

    # The snapshot shows the GPU as partly used, not free; a 200/1000 job cannot fit the 100 left.
    g = next(x for x in snapshot.take().snapshot.gpus if x.id == gpu)
    assert (g.free, g.used_milli, g.used_memory_mib) == (False, 900, 1000)
    small = submit(tenant, gpu_milli=200)
    assert cycle.run_cycle().ok
    assert state(small) == Job.State.PENDING and state(whole) == Job.State.PENDING
    assert "No GPU has 200/1000 of a GPU free now." in Job.objects.get(pk=small.pk).pending_message


def test_persist_refuses_a_share_past_1000_and_a_whole_placement_on_a_shared_gpu(one_gpu, tenant, no_dispatch):
    first = submit(tenant, gpu_milli=700)
    assert cycle.run_cycle().ok
    gpu = one_gpu.gpus("gpu0001")[0]
    late, whole = submit(tenant, gpu_milli=400), submit(tenant)
    taken = snapshot.take()
    cost = engine.Cost(hosts=1, leaves=1, pod_crossings=0, health_penalty=0.0, fragmentation_left=0)
    host = taken.snapshot.gpus[0].host
    # A plan made as if the GPU were empty (another cycle's stale view): both must be refused.
    plan = engine.Plan(decisions=[
        engine.Decision(job_id=late.pk, rank=0, placed=True, message="m", gpu_ids=(gpu,), host_ids=(host,), cost=cost,
                        leaves_lower_bound=1, shares=((gpu, 400, 0, ""),)),
        engine.Decision(job_id=whole.pk, rank=1, placed=True, message="m", gpu_ids=(gpu,), host_ids=(host,),
                        cost=cost, leaves_lower_bound=1)])
    result = cycle.CycleResult(ok=False)
    cycle.persist(taken, plan, result)
    assert result.conflicts == 2
    assert list(PlacementGpu.objects.filter(active=True).values_list("placement__job_id", "share_milli")) == [
        (first.pk, 700)]


def test_dispatch_tells_the_agent_the_share(one_gpu, tenant, no_dispatch):
    from pool.models import Gpu, Host

    Host.objects.filter(name="gpu0001").update(agent_url="http://127.0.0.1:9/h/gpu0001")
    Gpu.objects.filter(host__name="gpu0001").update(uuid="GPU-0001-0")
    a = submit(tenant, gpu_milli=250, gpu_memory_mib=2048)
    assert cycle.run_cycle().ok
    placement = a.placements.get()
    requests = dispatch.allocation_requests(Job.objects.get(pk=a.pk), placement.pk, dispatch.placement_parts(placement.pk))
    assert [r["gpus"] for r in requests] == [["GPU-0001-0"]]
    assert requests[0]["share"] == {"milli": 250, "memory_mib": 2048}


def test_a_share_counts_against_the_tenants_quota(db, tenant, no_dispatch):
    from fractions import Fraction

    from scheduler.models import TenantQuota

    cluster = build_cluster(fabric="sharequota", leaves=1, hosts_per_leaf=1, gpus=2)
    TenantQuota.objects.create(tenant=tenant, pool=cluster.pool, limit_gpus=1)
    first = submit(tenant, gpu_milli=600)
    assert cycle.run_cycle().ok
    assert state(first) == Job.State.APPROVED
    # The snapshot reports the running share as 3/5 of a GPU held by the tenant.
    taken = snapshot.take()
    (r,) = [r for r in taken.snapshot.running if r.job_id == first.pk]
    assert (r.gpu_ids, r.share, r.tenant) == ((), Fraction(3, 5), tenant.name)
    # 0.6 + 0.5 and 0.6 + 1 are over the limit of 1 GPU, though a whole GPU is free; 0.4 fits.
    over, whole, fits = submit(tenant, gpu_milli=500), submit(tenant), submit(tenant, gpu_milli=400)
    assert cycle.run_cycle().ok
    assert state(over) == state(whole) == Job.State.PENDING
    over.refresh_from_db()
    assert over.pending_reason == "quota"
    assert "would use 1.1 GPUs in pool main, over its limit of 1 (0.6 in use)" in over.pending_message
    assert state(fits) == Job.State.APPROVED
