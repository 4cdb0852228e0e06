"""Slurm topology.conf from the fabric, as NVIDIA Topograph and slurmibtopology write it.

tree:  one `SwitchName=<leaf> Nodes=<hosts>` per leaf, then `SwitchName=<spine>
       Switches=<leaves>` and `SwitchName=<core> Switches=<spines>`.
block: `BlockName=<name> Nodes=<hosts>` per group of hosts that share their leaves (a leaf
       in a plain fat tree; the scalable unit of leaves in a rail-optimized one).
gres.conf: `NodeName=<hosts> Name=gpu Type=<chip> File=/dev/nvidia[<indexes>]`, hosts with the
       same GPUs on one line (gres_conf; the caller passes the GPUs, fabric knows none).
"""
from __future__ import annotations

import re
from collections import defaultdict

from .fattree import natural_key
from .hostlist import compress
from .models import Fabric, Link, Switch

_MANAGED_NAME = re.compile(r"^[^;:]+;([^;:]+):[^;:]+$")  # MF0;<hostname>:<model>/<asic>
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def switch_names(rows) -> dict[int, str]:
    """Slurm-safe unique names from switch descriptions; rows: (pk, description, guid)."""
    base = {}
    for pk, description, guid in rows:
        m = _MANAGED_NAME.match(description.strip())
        name = m[1] if m else _UNSAFE.sub("_", description.strip()).strip("_")
        base[pk] = (name or f"S-{guid}", guid)
    counts = defaultdict(int)
    for name, _ in base.values():
        counts[name] += 1
    return {pk: name if counts[name] == 1 else f"{name}-{guid[-6:]}" for pk, (name, guid) in base.items()}


def _graph(fabric: Fabric, skip_states=(Link.State.MISSING, Link.State.DOWN)):
    switches = list(Switch.objects.filter(fabric=fabric, present=True).values_list("id", "description", "guid", "tier"))
    names = switch_names([(pk, d, g) for pk, d, g, _ in switches])
    tiers = {pk: tier for pk, _, _, tier in switches}
    hosts_of_leaf = defaultdict(set)
    neighbours = defaultdict(set)
    links = Link.objects.filter(fabric=fabric).exclude(state__in=list(skip_states)).values_list(
        "kind", "port_a__switch_id", "port_a__adapter__host_name", "port_a__adapter__is_aggregation_node",
        "port_b__switch_id", "port_b__adapter__host_name", "port_b__adapter__is_aggregation_node",
    )
    for kind, a_sw, a_host, a_agg, b_sw, b_host, b_agg in links:
        if kind == Link.Kind.SWITCH_SWITCH and a_sw in tiers and b_sw in tiers:
            neighbours[a_sw].add(b_sw)
            neighbours[b_sw].add(a_sw)
        elif kind == Link.Kind.ADAPTER_SWITCH:
            sw, host, agg = (a_sw, b_host, b_agg) if a_sw else (b_sw, a_host, a_agg)
            if sw in tiers and host and not agg:
                hosts_of_leaf[sw].add(host)
    return names, tiers, hosts_of_leaf, neighbours


def topology_tree(fabric: Fabric) -> str:
    names, tiers, hosts_of_leaf, neighbours = _graph(fabric)
    lines = [f"# Slurm topology.conf (tree) for fabric {fabric.name}, written by FabricPool"]
    order = {Switch.Tier.LEAF: 0, Switch.Tier.SPINE: 1, Switch.Tier.CORE: 2}
    below = {Switch.Tier.SPINE: Switch.Tier.LEAF, Switch.Tier.CORE: Switch.Tier.SPINE}
    multi = defaultdict(int)
    for hosts in hosts_of_leaf.values():
        for host in hosts:
            multi[host] += 1
    if any(count > 1 for count in multi.values()):
        lines.append("# Some hosts sit under several leaves (rail-optimized fabric): each is listed under every leaf it reaches.")
    for pk in sorted(names, key=lambda pk: (order.get(tiers[pk], 3), names[pk])):
        tier = tiers[pk]
        if tier == Switch.Tier.LEAF:
            if hosts_of_leaf[pk]:
                lines.append(f"SwitchName={names[pk]} Nodes={compress(hosts_of_leaf[pk])}")
        elif tier in below:
            children = [names[n] for n in neighbours[pk] if tiers.get(n) == below[tier]]
            if children:
                lines.append(f"SwitchName={names[pk]} Switches={compress(children)}")
    return "\n".join(lines) + "\n"


def leaf_groups(names: dict[int, str], hosts_of_leaf) -> dict[int, int]:
    """Leaf -> the first-named leaf of its group: leaves that share a host are one group
    (one leaf in a plain fat tree; the rails of a scalable unit in a rail-optimized one)."""
    parent = {pk: pk for pk in hosts_of_leaf}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first_leaf = {}
    for pk in sorted(hosts_of_leaf, key=lambda pk: names[pk]):
        for host in hosts_of_leaf[pk]:
            if host in first_leaf:
                parent[find(pk)] = find(first_leaf[host])
            else:
                first_leaf[host] = pk
    return {pk: find(pk) for pk in hosts_of_leaf}


def topology_block(fabric: Fabric) -> str:
    names, tiers, hosts_of_leaf, _ = _graph(fabric)
    group = leaf_groups(names, hosts_of_leaf)
    blocks = defaultdict(set)
    for pk, hosts in hosts_of_leaf.items():
        blocks[group[pk]] |= hosts
    lines = [f"# Slurm topology.conf (block) for fabric {fabric.name}, written by FabricPool"]
    for root in sorted(blocks, key=lambda pk: names[pk]):
        lines.append(f"BlockName={names[root]} Nodes={compress(blocks[root])}")
    return "\n".join(lines) + "\n"


_VENDOR_WORDS = {"NVIDIA", "AMD", "TESLA", "INSTINCT", "GEFORCE", "QUADRO", "RADEON", "PCIE", "SXM", "SXM4", "SXM5"}


def gres_type(model: str) -> str:
    """The GPU's chip as a gres Type: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB"
    -> "a100", "Tesla T4" -> "t4", "AMD Instinct MI300X" -> "mi300x", "NVIDIA GeForce RTX 4090" ->
    "rtx4090"; "" when the name has no chip word. Lower-case, so that it is also a substring of
    the name Slurm's AutoDetect=nvml reports."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", model.upper()) if w]
    for i, word in enumerate(words):
        if word in _VENDOR_WORDS or re.fullmatch(r"\d+(GB|G|MB)", word) or word.startswith("HBM"):
            continue
        if re.search(r"\d", word):
            if word.isdigit() and i and words[i - 1] not in _VENDOR_WORDS:
                word = words[i - 1] + word  # "RTX 4090" -> "rtx4090"
            return word.lower()
    return ""


def gres_conf(fabric_name: str, gpus_by_host: dict[str, list[tuple[int, str]]]) -> str:
    """gres.conf lines for hosts and their GPUs ({host: [(index, model), ...]}): one line per
    GPU type of each group of hosts whose GPUs are the same, device files from the indexes
    (NVML's index is the /dev/nvidiaN minor on a default driver install). Comments give the
    matching slurm.conf `Gres=` for each group."""
    groups = defaultdict(list)
    for host, gpus in gpus_by_host.items():
        by_type = defaultdict(list)
        for index, model in gpus:
            by_type[gres_type(model)].append(index)
        signature = tuple(sorted((gtype, tuple(sorted(indexes))) for gtype, indexes in by_type.items()))
        if signature:
            groups[signature].append(host)
    lines = [f"# Slurm gres.conf for the GPU hosts of fabric {fabric_name}, written by FabricPool",
             "# slurm.conf needs GresTypes=gpu and, per node, the Gres= shown above each group."]
    for signature, hosts in sorted(groups.items(), key=lambda item: min(map(natural_key, item[1]))):
        nodes = compress(hosts)
        gres = ",".join(f"gpu:{gtype}:{len(indexes)}" if gtype else f"gpu:{len(indexes)}" for gtype, indexes in signature)
        lines.append(f"# slurm.conf: NodeName={nodes} Gres={gres}")
        for gtype, indexes in signature:
            kind = f" Type={gtype}" if gtype else ""
            lines.append(f"NodeName={nodes} Name=gpu{kind} File={compress(f'/dev/nvidia{i}' for i in indexes)}")
    return "\n".join(lines) + "\n"
