"""The scheduler's tables: the database itself refuses a GPU in two active placements, the
operator role may decide placements and viewers may not, and the cycle is scheduled."""
import pytest
from django.db import IntegrityError, transaction
from django_celery_beat.models import PeriodicTask

from scheduler.models import Job, Placement, PlacementGpu, TenantQuota

pytestmark = pytest.mark.django_db


def placement(cluster, tenant, state=Placement.State.PROPOSED):
    job = Job.objects.create(tenant=tenant, pool=cluster.pool, gpus=1, command=["true"])
    return Placement.objects.create(job=job, state=state)


def test_a_gpu_cannot_be_in_two_active_placements(cluster, tenant):
    gpu = cluster.gpus("gpu0001")[0]
    first, second = placement(cluster, tenant), placement(cluster, tenant)
    PlacementGpu.objects.create(placement=first, gpu_id=gpu, active=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        PlacementGpu.objects.create(placement=second, gpu_id=gpu, active=True)
    # Bulk inserts (the cycle's path) are held to it too.
    with pytest.raises(IntegrityError), transaction.atomic():
        PlacementGpu.objects.bulk_create([PlacementGpu(placement=second, gpu_id=gpu, active=True)])
    assert PlacementGpu.objects.filter(gpu_id=gpu).count() == 1


def test_an_ended_placement_leaves_its_gpu_to_the_next(cluster, tenant):
    gpu = cluster.gpus("gpu0001")[0]
    first, second = placement(cluster, tenant), placement(cluster, tenant)
    PlacementGpu.objects.create(placement=first, gpu_id=gpu, active=True)
    PlacementGpu.objects.filter(placement=first).update(active=False)
    PlacementGpu.objects.create(placement=second, gpu_id=gpu, active=True)
    # History is kept: the GPU is listed in both, active in one.
    assert list(PlacementGpu.objects.filter(gpu_id=gpu).order_by("id").values_list("placement_id", "active")) == [
        (first.pk, False), (second.pk, True)]


def test_quota_limit_below_guarantee_is_refused(cluster, tenant):
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantQuota.objects.create(tenant=tenant, pool=cluster.pool, guaranteed_gpus=8, limit_gpus=4)


def test_operators_decide_placements_and_viewers_do_not(operator, viewer):
    assert operator.has_perm("scheduler.decide_placement")
    assert operator.has_perm("scheduler.add_job")
    assert not viewer.has_perm("scheduler.decide_placement")
    assert viewer.has_perm("scheduler.view_placement")


def test_the_allocation_cycle_is_scheduled():
    task = PeriodicTask.objects.get(task="scheduler.tasks.allocation_cycle")
    assert task.enabled
    assert task.interval.every == 5 and task.interval.period == "seconds"
