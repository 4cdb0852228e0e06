"""Exports for the schedulers a site already runs: Slurm gres.conf next to topology.conf,
and Kubernetes node labels (block / rack / host) for Kueue and KAI-Scheduler, as JSON and as
a `kubectl label` script."""
import json
import re
import shlex

import pytest
from django.core.management import CommandError, call_command

from fabric.hostlist import expand
from fabric.kubernetes import label_values, valid_value
from fabric.models import ChannelAdapter, Link, Switch
from fabric.slurm import gres_type
from pool.models import Gpu, Host

pytestmark = pytest.mark.django_db


def build(name, **options):
    args = ["build_fattree", "--fabric", name, "--speed", "EDR"]
    for key, value in {"spines": 2, "leaves": 4, "hosts_per_leaf": 2, "gpus_per_host": 4, **options}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    call_command(*args, verbosity=0)


def parse_gres(text):
    """{host: {(type, device file), ...}} and {host expression: Gres=} from gres.conf text."""
    devices, gres = {}, {}
    for line in text.splitlines():
        if m := re.match(r"# slurm.conf: NodeName=(\S+) Gres=(\S+)$", line):
            gres[m[1]] = m[2]
        if line.startswith("#") or not line.strip():
            continue
        fields = dict(item.split("=", 1) for item in line.split())
        assert fields.pop("Name") == "gpu"
        for host in expand(fields["NodeName"]):
            for path in expand(fields["File"]):
                devices.setdefault(host, set()).add((fields.get("Type", ""), path))
    return devices, gres


# --- Slurm gres.conf --------------------------------------------------------------------


def test_gres_conf_groups_hosts_with_the_same_gpus(tmp_path):
    build("s")
    hosts = sorted(Host.objects.filter(fabric__name="s").values_list("name", flat=True))
    odd, mixed = hosts[3], hosts[5]
    Gpu.objects.filter(host__name=odd, index=2).update(present=False)  # no longer reported
    Gpu.objects.filter(host__name=mixed, index__gte=2).update(model="Tesla T4")
    topology, gres_file = tmp_path / "topology.conf", tmp_path / "gres.conf"
    call_command("export_slurm_topology", "--fabric", "s", "-o", str(topology), "--gres-out", str(gres_file))
    assert topology.read_text().startswith("# Slurm topology.conf (tree)")
    text = gres_file.read_text()
    devices, gres = parse_gres(text)

    assert set(devices) == set(hosts)
    for host in hosts:
        expected = {("h100", f"/dev/nvidia{i}") for i in range(4)}
        if host == odd:
            expected -= {("h100", "/dev/nvidia2")}
        if host == mixed:
            expected = {("h100", "/dev/nvidia0"), ("h100", "/dev/nvidia1"), ("t4", "/dev/nvidia2"), ("t4", "/dev/nvidia3")}
        assert devices[host] == expected, host
    # The six alike hosts share one line; the two odd ones get their own.
    same = [h for h in hosts if h not in (odd, mixed)]
    assert f"NodeName=gpu[0001-0003,0005,0007-0008] Name=gpu Type=h100 File=/dev/nvidia[0-3]" in text
    assert set(expand("gpu[0001-0003,0005,0007-0008]")) == set(same)
    assert gres["gpu[0001-0003,0005,0007-0008]"] == "gpu:h100:4"
    assert gres[odd] == "gpu:h100:3" and f"NodeName={odd} Name=gpu Type=h100 File=/dev/nvidia[0-1,3]" in text
    assert gres[mixed] == "gpu:h100:2,gpu:t4:2"


def test_gres_to_stdout_follows_the_topology(capsys):
    build("s")
    call_command("export_slurm_topology", "--fabric", "s", "--format", "block", "--gres-out", "-")
    out = capsys.readouterr().out
    assert out.index("BlockName=") < out.index("# Slurm gres.conf") < out.index("Name=gpu Type=h100")


def test_gres_without_known_gpus_is_refused_and_writes_nothing(tmp_path):
    build("s", gpus_per_host=1)
    Gpu.objects.filter(host__fabric__name="s").update(present=False)
    topology, gres_file = tmp_path / "topology.conf", tmp_path / "gres.conf"
    with pytest.raises(CommandError, match="no GPUs are known for the hosts of fabric 's'"):
        call_command("export_slurm_topology", "--fabric", "s", "-o", str(topology), "--gres-out", str(gres_file))
    assert not topology.exists() and not gres_file.exists()


@pytest.mark.parametrize("model, expected", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "t4"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA GH200 480GB", "gh200"), ("", ""), ("Mystery Accelerator", ""),
])
def test_gres_type_is_the_chip_and_a_substring_of_the_nvml_name(model, expected):
    assert gres_type(model) == expected
    assert expected in re.sub(r"[^a-z0-9]", "", model.lower())


# --- Kubernetes labels --------------------------------------------------------------------


def labels_json(*args):
    from io import StringIO

    out = StringIO()
    call_command("export_topology_labels", *args, stdout=out)
    return json.loads(out.getvalue())


def test_three_tier_fabric_labels_pod_leaf_and_host():
    build("t3", spines=4, leaves=4, pods=2)
    data = labels_json("--fabric", "t3")
    keys = ["fabricpool.io/topology-block", "fabricpool.io/topology-rack", "fabricpool.io/topology-host"]
    assert data["levels"] == keys
    nodes = data["nodes"]
    assert len(nodes) == 8 and all(list(labels) == keys for labels in nodes.values())
    by_rack, by_block = {}, {}
    for host, labels in nodes.items():
        assert labels[keys[2]] == host
        by_rack.setdefault(labels[keys[1]], set()).add(host)
        by_block.setdefault(labels[keys[0]], set()).add(host)
    assert by_rack == {"p1-leaf001": {"gpu0001", "gpu0002"}, "p1-leaf002": {"gpu0003", "gpu0004"},
                       "p2-leaf003": {"gpu0005", "gpu0006"}, "p2-leaf004": {"gpu0007", "gpu0008"}}
    assert sorted(map(sorted, by_block.values())) == [[f"gpu000{i}" for i in range(1, 5)], [f"gpu000{i}" for i in range(5, 9)]]
    assert set(by_block) == {"p1-spine01", "p2-spine03"}


def test_two_tier_fabric_is_one_block_and_rail_leaves_make_one_rack():
    build("rail", leaves=4, hosts_per_leaf=2, hcas_per_host=2)
    nodes = labels_json("--fabric", "rail", "--style", "gce")["nodes"]
    racks = {host: labels["cloud.google.com/gce-topology-subblock"] for host, labels in nodes.items()}
    blocks = {labels["cloud.google.com/gce-topology-block"] for labels in nodes.values()}
    assert len(blocks) == 1
    # Each host hangs off two rail leaves; hosts sharing those leaves share one rack.
    leaves_of = {}
    for link in Link.objects.filter(fabric__name="rail", kind=Link.Kind.ADAPTER_SWITCH).select_related(
            "port_a__switch", "port_b__switch", "port_a__adapter", "port_b__adapter"):
        adapter = link.port_a.adapter or link.port_b.adapter
        switch = link.port_a.switch or link.port_b.switch
        leaves_of.setdefault(adapter.host_name, set()).add(switch.pk)
    assert all(len(leaves) == 2 for leaves in leaves_of.values())
    for a in nodes:
        for b in nodes:
            assert (racks[a] == racks[b]) == (leaves_of[a] == leaves_of[b]), (a, b)


def test_kubectl_script_is_shell_quoted_and_overwrites(capsys):
    build("k")
    ChannelAdapter.objects.filter(fabric__name="k", host_name="gpu0001").update(host_name="gpu 0001;rm -rf ~")
    call_command("export_topology_labels", "--fabric", "k", "--format", "kubectl", "--prefix", "example.com")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("#")
    commands = [shlex.split(line) for line in lines[1:]]
    assert len(commands) == 8
    hosts = set()
    for argv in commands:
        assert argv[:3] == ["kubectl", "label", "node"] and argv[-1] == "--overwrite"
        hosts.add(argv[3])
        labels = dict(arg.split("=", 1) for arg in argv[4:-1])
        assert set(labels) == {"example.com/topology-block", "example.com/topology-rack", "example.com/topology-host"}
        assert all(valid_value(v) for v in labels.values()), labels
    assert "gpu 0001;rm -rf ~" in hosts


def test_switch_names_become_valid_distinct_label_values():
    build("v")
    leaves = list(Switch.objects.filter(fabric__name="v", tier=Switch.Tier.LEAF).order_by("description"))
    leaves[0].description = "rack 7 / leaf A"   # spaces and a slash
    leaves[1].description = "rack 7 - leaf A"   # the same after cleaning
    leaves[2].description = "L" * 80 + "-end"   # too long
    for leaf in leaves[:3]:
        leaf.save()
    nodes = labels_json("--fabric", "v", "--prefix", "")["nodes"]
    racks = {labels["topology-rack"] for labels in nodes.values()}
    assert len(racks) == 4 and all(valid_value(v) and len(v) <= 63 for v in racks), racks

    values = label_values(["ok-name", "_x_", "a b", "a-b", "-", "é", "x" * 100])
    assert values["ok-name"] == "ok-name"
    assert len(set(values.values())) == len(values)
    assert all(valid_value(v) and v for v in values.values()), values


def test_a_host_without_a_leaf_is_refused_by_name(capsys):
    build("n")
    adapter_ports = ChannelAdapter.objects.get(fabric__name="n", host_name="gpu0003").ports.values_list("pk", flat=True)
    Link.objects.filter(port_a__in=adapter_ports).update(state=Link.State.MISSING)
    Link.objects.filter(port_b__in=adapter_ports).update(state=Link.State.MISSING)
    with pytest.raises(CommandError, match=r"1 host\(s\) of fabric 'n' have no leaf switch.*gpu0003"):
        call_command("export_topology_labels", "--fabric", "n", "--format", "kubectl")
    assert capsys.readouterr().out == ""
    # A down link is still structure: the host keeps its rack.
    Link.objects.filter(port_a__in=adapter_ports).update(state=Link.State.DOWN)
    Link.objects.filter(port_b__in=adapter_ports).update(state=Link.State.DOWN)
    assert "gpu0003" in labels_json("--fabric", "n")["nodes"]


@pytest.mark.parametrize("prefix", ["Bad_Prefix/", "-x.io", "a..b/"])
def test_a_bad_prefix_is_refused(prefix):
    build("p")
    with pytest.raises(CommandError, match="not a DNS subdomain"):
        call_command("export_topology_labels", "--fabric", "p", f"--prefix={prefix}")
