"""SCHEDULER_QUEUE_ORDER reaches the live cycle: with "short_first" a short job submitted
after a long one of the same size gets the only free room; with the default "age" the
older one does."""
import pytest

from scheduler import cycle, services
from scheduler.models import Job

from .conftest import build_cluster

pytestmark = pytest.mark.django_db


def race(tenant):
    build_cluster(leaves=1, hosts_per_leaf=1, gpus=4)  # room for one 4-GPU job
    long = services.submit_job(None, tenant=tenant, pool="main", gpus=4, command=["x"], estimated_runtime_s=36000)
    short = services.submit_job(None, tenant=tenant, pool="main", gpus=4, command=["x"], estimated_runtime_s=60)
    assert cycle.run_cycle().ok
    long.refresh_from_db()
    short.refresh_from_db()
    return long, short


def test_by_default_the_older_job_goes_first(tenant):
    long, short = race(tenant)
    assert long.state == Job.State.APPROVED and short.state == Job.State.PENDING


def test_short_first_lets_the_short_job_start(tenant, settings):
    settings.SCHEDULER_QUEUE_ORDER = "short_first"
    long, short = race(tenant)
    assert short.state == Job.State.APPROVED and long.state == Job.State.PENDING
