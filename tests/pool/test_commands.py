"""The pool's management commands: set agent URLs, poll now."""
import pytest
from django.core.management import CommandError, call_command

from pool.models import Host, Pool
from tests.pool.conftest import build_cluster

pytestmark = pytest.mark.django_db


def test_set_agent_urls_and_poll_now(cluster, hosts_simulator, capsys):
    sim = hosts_simulator("gpu0001\ngpu0002\ngpu0003\ngpu0004\n", seed=2)
    sim.fault("gpu0004", "down")
    call_command("set_agent_urls", "--fabric", cluster.name, "--template", sim.base + "/h/{host}")
    assert Host.objects.get(name="gpu0002").agent_url == f"{sim.base}/h/gpu0002"
    call_command("poll", "--fabric", cluster.name)
    out = capsys.readouterr().out
    assert f"4 hosts now poll {sim.base}/h/{{host}}" in out
    assert "polled 4 hosts: 3 reported (24 GPU samples), 1 did not" in out
    assert "  gpu0004 (new): disconnected: the agent closed the connection without an answer" in out


@pytest.mark.parametrize("argv, message", [
    (["set_agent_urls", "--template", "http://h:9400"], "has no {host} in it"),
    (["set_agent_urls", "--template", "http://{host}:{port}"], "only {host} may be in braces"),
    (["set_agent_urls", "--template", "http://{host}", "--fabric", "nope"], "no fabric named 'nope'"),
    (["poll", "--host", "nope"], "no pollable host named nope"),
])
def test_command_errors_name_the_problem(cluster, argv, message):
    with pytest.raises(CommandError, match=message.replace("{", r"\{").replace("}", r"\}")):
        call_command(*argv)


def test_a_pool_describes_its_gpu_models_and_sites(db, poll_settings):
    from fabric.models import Site

    fabric = build_cluster("p")
    fabric.site = Site.objects.create(name="berlin")
    fabric.save()
    pool = Pool.objects.create(name="h100-train")
    Host.objects.filter(name__in=["gpu0001", "gpu0002"]).update(pool=pool, site=fabric.site)
    assert (pool.gpu_models, pool.sites, pool.gpu_count) == (["NVIDIA H100 80GB HBM3"], ["berlin"], 16)


def test_fp64_class_table_can_be_extended_in_settings(settings):
    from pool.models import fp64_class_for

    assert [fp64_class_for(m) for m in ("NVIDIA A100-SXM4-80GB", "NVIDIA A10G", "Tesla T4", "AMD Instinct MI300X", "NVIDIA RTX 6000 Ada")] == [
        "high", "low", "low", "high", "low"]
    assert fp64_class_for("Mystery X1") == "unknown"
    settings.GPU_FP64_CLASSES = {"X1": "high", "A100": "low"}
    assert (fp64_class_for("Mystery X1"), fp64_class_for("NVIDIA A100 80GB PCIe")) == ("high", "low")
