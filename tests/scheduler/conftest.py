"""Fixtures for the scheduler's Django side: a small fat tree built by build_fattree with
its hosts in one pool and up (so they offer their GPUs), tenants, and users of each role."""
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from pool.models import Gpu, Host, Pool
from scheduler import signals, tasks
from scheduler.models import Tenant


def make_user(username: str, role: str) -> User:
    account = User.objects.create_user(username, password="unused-password-1")
    account.groups.add(Group.objects.get(name=role))
    return account


@dataclass
class Cluster:
    pool: Pool
    fabric: str

    def hosts(self):
        return list(Host.objects.filter(fabric__name=self.fabric).order_by("name"))

    def gpus(self, host_name: str) -> list[int]:
        return list(Gpu.objects.filter(host__name=host_name).order_by("index").values_list("id", flat=True))

    def leaf_of(self, host_name: str) -> str:
        adapter = Host.objects.get(name=host_name).adapters.get()
        link = adapter.ports.get().links_as_b.first() or adapter.ports.get().links_as_a.first()
        port = link.port_a if link.port_a.adapter_id is None else link.port_b
        return port.switch.description


def build_cluster(fabric="sched", pool="main", spines=2, leaves=4, hosts_per_leaf=2, gpus=4, pods=0) -> Cluster:
    """leaves × hosts_per_leaf hosts of `gpus` GPUs each (gpu0001.. under leaf001..), all up
    and in `pool`. 3-tier when pods > 1."""
    args = ["--fabric", fabric, "--spines", str(spines), "--leaves", str(leaves), "--hosts-per-leaf",
            str(hosts_per_leaf), "--gpus-per-host", str(gpus), "--speed", "EDR"]
    if pods:
        args += ["--pods", str(pods)]
    call_command("build_fattree", *args, verbosity=0)
    pool_row, _ = Pool.objects.get_or_create(name=pool)
    Host.objects.filter(fabric__name=fabric).update(pool=pool_row, state=Host.State.UP)
    return Cluster(pool=pool_row, fabric=fabric)


@pytest.fixture
def cluster(db) -> Cluster:
    """8 hosts × 4 GPUs under 4 leaves (2 hosts each), 2 spines, pool "main"."""
    return build_cluster()


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(name="physics")


@pytest.fixture
def operator(db) -> User:
    return make_user("alice", "operator")


@pytest.fixture
def operator2(db) -> User:
    return make_user("bob", "operator")


@pytest.fixture
def viewer(db) -> User:
    return make_user("vera", "viewer")


@pytest.fixture
def no_dispatch(monkeypatch):
    """Tests that commit decisions (on_commit callbacks run) without dispatch's receivers and
    cycle requests, which would enqueue real Celery tasks; a test may connect its own receivers."""
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: False)
    for signal in (signals.placements_approved, signals.placements_stop_requested):
        monkeypatch.setattr(signal, "receivers", [])
        monkeypatch.setattr(signal, "sender_receivers_cache", {})
