"""The synthetic fat-tree builder, its text outputs and the build_fattree command."""
import re
from collections import Counter, defaultdict
from dataclasses import asdict

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from fabric import fattree
from fabric import ibnetdiscover as ibd
from fabric.importer import import_file, import_topology
from fabric.models import ChannelAdapter, Fabric, FabricEvent, Link, Switch
from fabric.summary import fabric_summary
from fabric.tiers import infer_tiers
from pool.models import Gpu, Host
from pool.services import register_hosts_from_fabric, synthetic_gpu_uuid


def by_name(topo):
    return {node.description: node for node in topo.nodes.values()}


def neighbours(topo):
    """{description: Counter(remote description -> cables)}"""
    names = {guid: node.description for guid, node in topo.nodes.items()}
    out = defaultdict(Counter)
    for link in topo.links:
        a, b = names[link.a[0]], names[link.b[0]]
        out[a][b] += 1
        out[b][a] += 1
    return out


def port_map(topo, name):
    """{local port: remote description} of one node."""
    names = {guid: node.description for guid, node in topo.nodes.items()}
    node = by_name(topo)[name]
    ports = {}
    for link in topo.links:
        for near, far in ((link.a, link.b), (link.b, link.a)):
            if near[0] == node.guid:
                ports[near[1]] = names[far[0]]
    return dict(sorted(ports.items()))


def normalised(topo):
    """Everything a topology says except where in a file it came from."""
    nodes = {}
    for guid, node in topo.nodes.items():
        data = asdict(node)
        data.pop("line")
        nodes[guid] = data
    links = sorted((lk.a, lk.b, lk.width, lk.speed, lk.b_kind, lk.b_description) for lk in topo.links)
    return nodes, links, topo.warnings, topo.generated, topo.initiated_from


# -- shapes ----------------------------------------------------------------------------------


def test_two_tier_every_leaf_reaches_every_spine_once():
    tree = fattree.build(spines=4, leaves=8, hosts_per_leaf=16)
    topo = tree.topology
    assert Counter(infer_tiers(topo).values()) == {"leaf": 8, "spine": 4}
    assert len(topo.adapters()) == len(tree.hosts) == 128
    assert len(topo.links) == 8 * 16 + 8 * 4
    near = neighbours(topo)
    for leaf in [f"leaf{i:03d}" for i in range(1, 9)]:
        assert {n: c for n, c in near[leaf].items() if n.startswith("spine")} == {f"spine{j:02d}": 1 for j in range(1, 5)}
        assert sum(c for n, c in near[leaf].items() if n.startswith("gpu")) == 16
    assert all(link.width == "4x" and link.speed == "NDR" and link.gbps == 400.0 for link in topo.links)
    assert topo.dangling_links() == []


def test_ports_hosts_first_then_uplinks():
    topo = fattree.build(spines=2, leaves=4, hosts_per_leaf=3).topology
    assert port_map(topo, "leaf002") == {
        1: "gpu0004 mlx5_0", 2: "gpu0005 mlx5_0", 3: "gpu0006 mlx5_0", 4: "spine01", 5: "spine02",
    }
    assert port_map(topo, "spine02") == {1: "leaf001", 2: "leaf002", 3: "leaf003", 4: "leaf004"}
    assert by_name(topo)["leaf002"].num_ports == 5
    assert by_name(topo)["gpu0006 mlx5_0"].num_ports == 1


def test_hosts_and_adapter_names():
    tree = fattree.build(spines=1, leaves=2, hosts_per_leaf=2)
    assert [h.name for h in tree.hosts] == ["gpu0001", "gpu0002", "gpu0003", "gpu0004"]
    assert tree.hosts[2].leaves == ("leaf002",)
    assert sorted(n.description for n in tree.topology.adapters()) == [
        "gpu0001 mlx5_0", "gpu0002 mlx5_0", "gpu0003 mlx5_0", "gpu0004 mlx5_0",
    ]
    assert {ibd.host_name_from_description(n.description) for n in tree.topology.adapters()} == {h.name for h in tree.hosts}


def test_rail_optimized_host_has_one_hca_per_rail_leaf():
    tree = fattree.build(spines=2, leaves=8, hosts_per_leaf=4, hcas_per_host=4)
    topo = tree.topology
    assert len(tree.hosts) == 8 / 4 * 4
    assert len(topo.adapters()) == 8 * 4
    first, fifth = tree.hosts[0], tree.hosts[4]
    assert first.devices == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert first.leaves == ("leaf001", "leaf002", "leaf003", "leaf004")
    assert fifth.leaves == ("leaf005", "leaf006", "leaf007", "leaf008")
    near = neighbours(topo)
    # Each rail leaf carries one rail only, from every host of its group.
    assert sorted(n for n in near["leaf003"] if n.startswith("gpu")) == [f"gpu000{i} mlx5_2" for i in range(1, 5)]
    assert sorted(n for n in near["leaf006"] if n.startswith("gpu")) == [f"gpu000{i} mlx5_1" for i in range(5, 9)]
    assert Counter(infer_tiers(topo).values()) == {"leaf": 8, "spine": 2}


def test_three_tier_pods_stay_apart_below_the_cores():
    tree = fattree.build(spines=8, leaves=16, hosts_per_leaf=2, pods=4)
    topo = tree.topology
    assert tree.cores == 2  # spines / pods
    assert Counter(infer_tiers(topo).values()) == {"leaf": 16, "spine": 8, "core": 2}
    names = by_name(topo)
    assert "p1-leaf001" in names and "p4-leaf016" in names and "p2-spine03" in names and "core02" in names
    near = neighbours(topo)
    assert {n for n in near["p2-leaf005"] if "spine" in n} == {"p2-spine03", "p2-spine04"}
    assert {n for n in near["p4-spine08"] if "leaf" in n} == {"p4-leaf013", "p4-leaf014", "p4-leaf015", "p4-leaf016"}
    for spine in (n for n in names if "spine" in n):
        assert {n: c for n, c in near[spine].items() if n.startswith("core")} == {"core01": 1, "core02": 1}
    assert len(topo.links) == 16 * 2 + 16 * 2 + 8 * 2
    assert port_map(topo, "core02") == {j: f"p{(j + 1) // 2}-spine{j:02d}" for j in range(1, 9)}


def test_three_tier_core_count_and_rails_within_pods():
    tree = fattree.build(spines=4, leaves=8, hosts_per_leaf=2, pods=2, cores=3, hcas_per_host=2)
    assert Counter(infer_tiers(tree.topology).values()) == {"leaf": 8, "spine": 4, "core": 3}
    assert tree.hosts[3].leaves == ("p1-leaf003", "p1-leaf004")
    assert tree.hosts[4].leaves == ("p2-leaf005", "p2-leaf006")


def test_same_parameters_same_fabric_and_unique_guids():
    one = fattree.build(spines=4, leaves=8, hosts_per_leaf=4, pods=2, hcas_per_host=2)
    two = fattree.build(spines=4, leaves=8, hosts_per_leaf=4, pods=2, hcas_per_host=2)
    assert fattree.to_ibnetdiscover(one.topology) == fattree.to_ibnetdiscover(two.topology)
    port_guids = [p.guid for n in one.topology.adapters() for p in n.ports.values()]
    assert len(set(one.topology.nodes) | set(port_guids)) == len(one.topology.nodes) + len(port_guids)
    lids = [n.lid for n in one.topology.switches()] + [p.lid for n in one.topology.adapters() for p in n.ports.values()]
    assert len(set(lids)) == len(lids) and min(lids) == 1


def test_largest_switch_fits():
    tree = fattree.build(spines=4, leaves=1, hosts_per_leaf=251, gpus_per_host=1)
    assert by_name(tree.topology)["leaf001"].num_ports == 255


def test_speed_names_are_case_insensitive():
    assert fattree.build(spines=1, leaves=1, hosts_per_leaf=1, speed="edr").topology.links[0].speed == "EDR"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spines": 0}, "spines must be at least 1, got 0"),
        ({"leaves": -2}, "leaves must be at least 1, got -2"),
        ({"hosts_per_leaf": "4"}, "hosts_per_leaf must be a whole number, got '4'"),
        ({"gpus_per_host": 2.5}, "gpus_per_host must be a whole number"),
        ({"hcas_per_host": True}, "hcas_per_host must be a whole number"),
        ({"hcas_per_host": 128, "leaves": 128}, "hcas_per_host must be at most 64, got 128"),
        ({"gpus_per_host": 5000}, "gpus_per_host must be at most 1024, got 5000"),
        ({"pods": -1}, "pods must be at least 0"),
        ({"leaves": 6, "hcas_per_host": 4}, r"leaves \(6\) must be a multiple of hcas_per_host \(4\)"),
        ({"leaves": 6, "pods": 4}, r"leaves \(6\) must divide evenly into 4 pods"),
        ({"spines": 6, "leaves": 8, "pods": 4}, r"spines \(6\) must divide evenly into 4 pods"),
        ({"spines": 4, "leaves": 12, "pods": 2, "hcas_per_host": 4}, r"leaves per pod \(6\) must be a multiple of hcas_per_host \(4\)"),
        ({"cores": 2}, r"cores apply only to a 3-tier fabric \(pods > 1\)"),
        ({"spines": 4, "leaves": 4, "pods": 2, "cores": 0}, "cores must be at least 1"),
        ({"speed": "FAST"}, "unknown speed 'FAST': expected one of SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR"),
        ({"width": "3x"}, "unknown width '3x'"),
        ({"hosts_per_leaf": 252}, "a leaf switch would need 256 ports; at most 255"),
        ({"spines": 300, "leaves": 2, "pods": 2}, "a core switch would need 300 ports"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    params = {"spines": 4, "leaves": 4, "hosts_per_leaf": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        fattree.build(**params)


# -- text outputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"spines": 2, "leaves": 4, "hosts_per_leaf": 3},
        {"spines": 4, "leaves": 8, "hosts_per_leaf": 2, "pods": 2, "hcas_per_host": 2, "speed": "HDR"},
    ],
)
def test_ibnetdiscover_text_parses_back_to_the_same_topology(kwargs):
    topo = fattree.build(**kwargs).topology
    text = fattree.to_ibnetdiscover(topo)
    parsed = ibd.parse(text.encode())
    assert parsed.warnings == []
    assert normalised(parsed) == normalised(topo)


def test_ibnetdiscover_text_looks_like_the_real_tool():
    text = fattree.to_ibnetdiscover(fattree.build(spines=1, leaves=1, hosts_per_leaf=1).topology)
    lines = text.splitlines()
    assert lines[1].startswith("# Topology file: generated with fabricpool fattree")
    assert "switchguid=0xfab0010000000100(fab0010000000100)" in lines
    assert 'Switch\t2 "S-fab0010000000100"\t\t# "leaf001" enhanced port 0 lid 1 lmc 0' in lines
    assert '[1]\t"H-fab0040000000100"[1](fab0040000000101) \t\t# "gpu0001 mlx5_0" lid 3 4xNDR' in lines
    assert '[1](fab0040000000101) \t"S-fab0010000000100"[1]\t\t# lid 3 lmc 0 "leaf001" lid 1 4xNDR' in lines


def test_ibsim_net_writes_both_ends_and_substitutes_ndr():
    tree = fattree.build(spines=1, leaves=2, hosts_per_leaf=1)
    net = fattree.to_ibsim_net(tree)
    assert "# ibsim 0.10 has no NDR: NDR links are written as HDR" in net
    blocks = net.split("\n\n")
    assert blocks[1] == 'Hca\t1\t"gpu0001 mlx5_0"\n[1]\t"leaf001"[1]\ts=4 e=4 w=2'  # a host first: the SM attaches there
    assert 'Switch\t2\t"spine01"\n[1]\t"leaf001"[2]\ts=4 e=4 w=2\n[2]\t"leaf002"[2]\ts=4 e=4 w=2\n' in net + "\n"
    edr = fattree.to_ibsim_net(fattree.build(spines=1, leaves=1, hosts_per_leaf=1, speed="EDR"))
    assert "has no" not in edr and "e=2 w=2" in edr


# -- build_fattree and host registration ---------------------------------------------------------

def summary_without_name(name):
    data = fabric_summary(Fabric.objects.get(name=name))
    data.pop("fabric")
    return data


def state(name):
    """What a user could see change: summary, events, hosts, adapter links, GPUs."""
    return (
        summary_without_name(name),
        FabricEvent.objects.filter(fabric__name=name).count(),
        list(Host.objects.order_by("name").values_list("name", "fabric__name", "in_fabric", "agent_url", "pool_id")),
        sorted(Host.adapters.through.objects.values_list("host__name", "channeladapter__description")),
        list(Gpu.objects.order_by("host__name", "index").values_list("host__name", "index", "uuid", "model", "memory_mib", "nearest_hca")),
    )


@pytest.mark.django_db
def test_build_fattree_imports_and_registers(tmp_path, capsys):
    call_command("build_fattree", fabric="lab", spines=4, leaves=8, hosts_per_leaf=4, pods=2, gpus_per_host=4,
                 ibsim_net=str(tmp_path / "net"), ibnetdiscover_out=str(tmp_path / "topo.txt"))
    out = capsys.readouterr().out
    assert "3-tier fat tree: 2 pods, 2 cores, 4 spines, 8 leaves, 4 hosts per leaf, 32 hosts x 4 GPUs, 4xNDR" in out
    assert "fabric lab: 14 switches, 32 adapters, 56 links (first import)" in out
    assert "32 hosts (32 new, 0 updated, 0 left the fabric), 128 GPUs new" in out
    summary = fabric_summary(Fabric.objects.get(name="lab"))
    assert summary["switches"] == {"leaf": 8, "spine": 4, "core": 2, "unknown": 0, "total": 14}
    assert summary["hosts"] == 32 and summary["adapters"] == 32
    assert summary["links"]["switch_switch"] == 8 * 2 + 4 * 2 and summary["links"]["adapter_switch"] == 32
    assert summary["leaves"][0] == {
        "name": "p1-leaf001", "guid": "0xfab0010000000100", "hosts": ["gpu0001", "gpu0002", "gpu0003", "gpu0004"],
        "adapters": 4, "uplink_gbps": 800.0, "downlink_gbps": 1600.0, "oversubscription": 2.0,
    }
    host = Host.objects.get(name="gpu0007")
    assert host.fabric.name == "lab" and host.in_fabric and host.agent_url == "http://gpu0007:9400"
    assert [a.description for a in host.adapters.all()] == ["gpu0007 mlx5_0"]
    assert list(host.gpus.values_list("index", "nearest_hca", "model", "memory_mib")) == [
        (i, "mlx5_0", fattree.DEFAULT_GPU_MODEL, fattree.DEFAULT_GPU_MEMORY_MIB) for i in range(4)
    ]
    assert host.gpus.get(index=2).uuid == synthetic_gpu_uuid("gpu0007", 2)
    assert Gpu.objects.filter(uuid__startswith="GPU-").values("uuid").distinct().count() == 128
    assert (tmp_path / "net").read_text().startswith("# ibsim net file")
    # The written topology imports into another fabric as the very same fabric.
    import_file(str(tmp_path / "topo.txt"), "lab-copy")
    assert summary_without_name("lab-copy") == summary_without_name("lab")


@pytest.mark.django_db
def test_build_fattree_twice_changes_nothing(capsys):
    args = dict(fabric="lab", spines=2, leaves=4, hosts_per_leaf=4, hcas_per_host=2, gpu_model="NVIDIA A100-SXM4-80GB")
    call_command("build_fattree", **args)
    before = state("lab")
    capsys.readouterr()
    call_command("build_fattree", **args)
    out = capsys.readouterr().out
    assert "fabric lab: 6 switches, 16 adapters, 24 links: no changes" in out
    assert "8 hosts (0 new, 0 updated, 0 left the fabric), 0 GPUs new, 0 updated" in out
    assert state("lab") == before


@pytest.mark.django_db
def test_rail_optimized_gpus_sit_next_to_their_rail():
    call_command("build_fattree", fabric="rails", spines=2, leaves=8, hosts_per_leaf=2, hcas_per_host=4, verbosity=0)
    host = Host.objects.get(name="gpu0003")
    assert sorted(host.adapters.values_list("description", flat=True)) == [f"gpu0003 mlx5_{r}" for r in range(4)]
    assert list(host.gpus.values_list("nearest_hca", flat=True)) == [f"mlx5_{i % 4}" for i in range(8)]
    summary = fabric_summary(Fabric.objects.get(name="rails"))
    assert summary["hosts"] == 4 and summary["adapters"] == 16
    assert [leaf["hosts"] for leaf in summary["leaves"][4:8]] == [["gpu0003", "gpu0004"]] * 4


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spines": 0}, "cannot build that fat tree: spines must be at least 1, got 0 (nothing was changed)"),
        ({"leaves": 3, "hcas_per_host": 2}, "leaves (3) must be a multiple of hcas_per_host (2)"),
        ({"speed": "QUICK"}, "unknown speed 'QUICK'"),
        ({"pods": 3}, "leaves (4) must divide evenly into 3 pods"),
        ({"cores": 2}, "cores apply only to a 3-tier fabric"),
        ({"fabric": "my lab"}, "--fabric 'my lab': use letters, digits, '-' and '_' only"),
        ({"gpu_model": " "}, "--gpu-model ' ': give 1 to 80 characters"),
        ({"gpu_memory_mib": 0}, "--gpu-memory-mib must be at least 1"),
        ({"ibsim_net": "/nonexistent-dir/net"}, "--ibsim-net /nonexistent-dir/net: No such file or directory"),
    ],
)
def test_build_fattree_bad_arguments_change_nothing(kwargs, message):
    args = {"fabric": "lab", "spines": 2, "leaves": 4, "hosts_per_leaf": 2} | kwargs
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("build_fattree", **args)
    assert not Fabric.objects.exists() and not Host.objects.exists()


@pytest.mark.django_db
def test_build_fattree_rejects_non_numbers():
    with pytest.raises(CommandError, match="argument --spines: invalid int value: 'two'"):
        call_command("build_fattree", "--fabric", "lab", "--spines", "two", "--leaves", "2", "--hosts-per-leaf", "2")


@pytest.mark.django_db
def test_hosts_that_leave_the_fabric_are_kept_and_come_back():
    call_command("build_fattree", fabric="lab", spines=2, leaves=2, hosts_per_leaf=4, gpus_per_host=2, verbosity=0)
    call_command("build_fattree", fabric="lab", spines=2, leaves=2, hosts_per_leaf=3, gpus_per_host=2, verbosity=0)
    gone = Host.objects.filter(in_fabric=False)
    assert sorted(gone.values_list("name", flat=True)) == ["gpu0007", "gpu0008"]
    assert Host.objects.count() == 8 and Gpu.objects.filter(host__in=gone).count() == 4
    assert Host.objects.get(name="gpu0008").adapters.count() == 1  # still shows what it had
    call_command("build_fattree", fabric="lab", spines=2, leaves=2, hosts_per_leaf=4, gpus_per_host=2, verbosity=0)
    assert not Host.objects.filter(in_fabric=False).exists()
    assert ChannelAdapter.objects.filter(fabric__name="lab", present=True).count() == 8


@pytest.mark.django_db
def test_registration_keeps_what_agents_and_operators_set():
    topo = fattree.build(spines=1, leaves=1, hosts_per_leaf=2, hcas_per_host=1).topology
    fabric = import_topology(topo, "lab").fabric
    register_hosts_from_fabric(fabric, gpus_per_host=2)
    Gpu.objects.filter(host__name="gpu0001", index=0).update(uuid="GPU-from-the-agent", model="NVIDIA H200")
    Host.objects.filter(name="gpu0002").update(agent_url="https://gpu0002.example:8443")
    result = register_hosts_from_fabric(fabric, gpus_per_host=2, gpu_model="NVIDIA B200", memory_mib=183359)
    assert result.gpus_updated == 3 and result.hosts_updated == 0
    assert Gpu.objects.get(host__name="gpu0001", index=0).model == "NVIDIA H200"
    assert Gpu.objects.get(host__name="gpu0001", index=1).model == "NVIDIA B200"
    assert Host.objects.get(name="gpu0002").agent_url == "https://gpu0002.example:8443"


@pytest.mark.django_db
@override_settings(AGENT_URL_TEMPLATE="https://{host}.cluster.example:9443/agent")
def test_agent_url_comes_from_the_setting():
    fabric = import_topology(fattree.build(spines=1, leaves=1, hosts_per_leaf=1).topology, "lab").fabric
    register_hosts_from_fabric(fabric)
    host = Host.objects.get()
    assert host.agent_url == "https://gpu0001.cluster.example:9443/agent"
    assert not host.gpus.exists()  # no gpus_per_host: GPUs are left to the agents


@pytest.mark.django_db
def test_registration_ignores_aggregation_nodes_and_unnamed_adapters():
    topo = fattree.build(spines=1, leaves=1, hosts_per_leaf=1).topology
    leaf = topo.switches()[0]
    for n, desc in ((1, ibd.AGGREGATION_NODE_DESCRIPTION), (2, "MT4129 ConnectX-7 Mellanox Technologies")):
        ca = ibd.Node(kind=ibd.CA, guid=0x77 + n, description=desc, num_ports=1, line=0)
        ca.ports[1] = ibd.Port(1, 0x7700 + n, 90 + n)
        topo.nodes[ca.guid] = ca
        leaf.ports[10 + n] = ibd.Port(10 + n, leaf.guid, leaf.lid)
        topo.links.append(ibd.Link(a=(leaf.guid, 10 + n), b=(ca.guid, 1), width="4x", speed="NDR", line=0, b_kind=ibd.CA))
    fabric = import_topology(topo, "lab").fabric
    result = register_hosts_from_fabric(fabric, gpus_per_host=1)
    assert result.hosts == 1 and list(Host.objects.values_list("name", flat=True)) == ["gpu0001"]


@pytest.mark.django_db
def test_registration_is_a_fixed_number_of_queries(django_assert_max_num_queries):
    fabric = import_topology(fattree.build(spines=2, leaves=8, hosts_per_leaf=16, hcas_per_host=2).topology, "lab").fabric
    with django_assert_max_num_queries(20):
        result = register_hosts_from_fabric(fabric, gpus_per_host=8)
    assert result.hosts == 64 and result.gpus_created == 512
    assert Link.objects.filter(fabric=fabric).count() == 128 + 16 and Switch.objects.filter(fabric=fabric).count() == 10
