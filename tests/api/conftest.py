"""Fixtures of the API tests: the scheduler tests' small fat tree (8 hosts × 4 GPUs, pool
"main", manual approval so proposals wait), a tenant, one user per role with an API token,
and a client that sends the token."""
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from api import throttling
from api.models import ApiToken
from pool.models import Gpu
from scheduler import services, signals, tasks
from scheduler.models import Job, Placement, PlacementGpu, PoolPolicy, Tenant
from tests.scheduler.conftest import build_cluster

ROLES = ("viewer", "operator", "admin")


@dataclass
class Caller:
    user: User
    token: str
    client: Client

    def get(self, path, **query):
        return self.client.get(path, query, HTTP_AUTHORIZATION=f"Bearer {self.token}")

    def post(self, path, body=None):
        return self.client.post(path, body if body is not None else {}, content_type="application/json",
                                HTTP_AUTHORIZATION=f"Bearer {self.token}")


def make_user(username: str, role: str | None) -> User:
    user = User.objects.create_user(username, password="unused-password-1")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def caller(username: str, role: str | None) -> Caller:
    user = make_user(username, role)
    _, token = ApiToken.issue(user=user, name="tests")
    return Caller(user, token, Client())


@pytest.fixture(autouse=True)
def own_throttle_keys(monkeypatch):
    """Throttle counts live in the shared cache (Redis) keyed by user id, and ids repeat
    between tests: each test counts under its own scope."""
    monkeypatch.setattr(throttling.WriteRateThrottle, "scope", f"api_write_test_{uuid.uuid4().hex}")


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch):
    """Decisions commit without enqueuing real Celery work (as in tests/scheduler)."""
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: False)
    for signal in (signals.placements_approved, signals.placements_stop_requested):
        monkeypatch.setattr(signal, "receivers", [])
        monkeypatch.setattr(signal, "sender_receivers_cache", {})


@pytest.fixture
def cluster(db):
    c = build_cluster()
    PoolPolicy.objects.create(pool=c.pool, mode=PoolPolicy.Mode.MANUAL)
    return c


@pytest.fixture
def tenant(db):
    return Tenant.objects.create(name="physics")


@pytest.fixture
def viewer(db):
    return caller("vera", "viewer")


@pytest.fixture
def operator(db):
    return caller("otto", "operator")


@pytest.fixture
def admin_caller(db):
    return caller("ada", "admin")


@pytest.fixture
def callers(viewer, operator, admin_caller):
    return {"viewer": viewer, "operator": operator, "admin": admin_caller}


def propose(tenant, gpus=4, host="gpu0001", **kw) -> Placement:
    """A job and a proposal for it on `host`'s first GPUs, as a cycle under the pool's manual
    policy leaves it (written directly: these tests are about the API, not the engine)."""
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=gpus, command=["train"], **kw)
    gpu_ids = list(Gpu.objects.filter(host__name=host).order_by("index").values_list("id", flat=True)[:gpus])
    placement = Placement.objects.create(job=job, state=Placement.State.PROPOSED, hosts=1, leaves=1,
                                         expires_at=timezone.now() + timedelta(minutes=5))
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=placement, gpu_id=g) for g in gpu_ids])
    Job.objects.filter(pk=job.pk).update(state=Job.State.PROPOSED)
    return placement
