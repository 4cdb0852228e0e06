"""Growing the cluster is plugging in servers: every fabric import registers the hosts
discovery found (agent URL from AGENT_URL_TEMPLATE), and flags, never deletes, the ones
whose adapters vanished."""
import pytest

from fabric import fattree
from fabric.importer import import_topology
from pool import tasks
from pool.models import Gpu, Host, HostEvent

pytestmark = pytest.mark.django_db


def tree(hosts_per_leaf):
    return fattree.build(spines=2, leaves=2, hosts_per_leaf=hosts_per_leaf, gpus_per_host=8)


def discover(topology, django_capture_on_commit_callbacks, name="grow"):
    with django_capture_on_commit_callbacks(execute=True):
        return import_topology(topology, name, source_name="discovery")


def test_discovered_hosts_are_registered_and_polled(settings, django_capture_on_commit_callbacks, hosts_simulator):
    sim = hosts_simulator("\n".join(f"gpu{i:04d}" for i in range(1, 7)))
    settings.AGENT_URL_TEMPLATE = sim.base + "/h/{host}"
    discover(tree(2).topology, django_capture_on_commit_callbacks)
    assert sorted(Host.objects.values_list("name", "agent_url", "state")) == [
        (f"gpu{i:04d}", f"{sim.base}/h/gpu{i:04d}", "new") for i in range(1, 5)]
    assert not Gpu.objects.exists()  # GPUs join with the first report
    assert HostEvent.objects.filter(kind="registered").count() == 4

    # two more servers cabled in: the next discovery finds them
    discover(tree(3).topology, django_capture_on_commit_callbacks)
    assert Host.objects.count() == 6
    new = Host.objects.get(name="gpu0006")
    assert HostEvent.objects.get(host=new).message == f"registered from discovery of fabric grow; agent at {sim.base}/h/gpu0006"
    assert new.adapters.get().description == "gpu0006 mlx5_0"

    stats = tasks.poll_hosts(Host.objects.values_list("id", flat=True))
    assert (stats.hosts_ok, stats.gpus_created) == (6, 48)
    assert Gpu.objects.filter(host=new).count() == 8 and Host.objects.get(name="gpu0006").state == "up"


def test_a_host_that_vanishes_is_flagged_not_deleted(django_capture_on_commit_callbacks):
    discover(tree(3).topology, django_capture_on_commit_callbacks)
    discover(tree(2).topology, django_capture_on_commit_callbacks)  # gpu0005 and gpu0006 unplugged
    gone = Host.objects.filter(in_fabric=False).order_by("name")
    assert [h.name for h in gone] == ["gpu0005", "gpu0006"]
    assert HostEvent.objects.get(host=gone[0], kind="vanished").message == (
        "no adapter of gpu0005 in the latest discovery of fabric grow; kept with its history")
    discover(tree(3).topology, django_capture_on_commit_callbacks)  # plugged back
    assert not Host.objects.filter(in_fabric=False).exists()
    assert HostEvent.objects.get(host=gone[0], kind="returned").message == "back in fabric grow"


def test_an_import_that_fails_registers_nothing(django_capture_on_commit_callbacks):
    with pytest.raises(ValueError), django_capture_on_commit_callbacks(execute=True) as callbacks:
        from django.db import transaction

        with transaction.atomic():
            import_topology(tree(2).topology, "grow", source_name="discovery")
            raise ValueError("something after the import failed")
    assert callbacks == [] and not Host.objects.exists()


def test_an_unchanged_rediscovery_changes_no_host(django_capture_on_commit_callbacks):
    discover(tree(2).topology, django_capture_on_commit_callbacks)
    before = list(Host.objects.values_list("id", "name", "agent_url", "in_fabric"))
    events = HostEvent.objects.count()
    discover(tree(2).topology, django_capture_on_commit_callbacks)
    assert list(Host.objects.values_list("id", "name", "agent_url", "in_fabric")) == before
    assert HostEvent.objects.count() == events
