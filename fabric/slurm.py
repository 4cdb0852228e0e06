"""Slurm topology.conf from the fabric, as NVIDIA Topograph and slurmibtopology write it.

tree:  one `SwitchName=<leaf> Nodes=<hosts>` per leaf, then `SwitchName=<spine>
       Switches=<leaves>` and `SwitchName=<core> Switches=<spines>`.
block: `BlockName=<name> Nodes=<hosts>` per group of hosts that share their leaves (a leaf
       in a plain fat tree; the scalable unit of leaves in a rail-optimized one).
"""
from __future__ import annotations

import re
from collections import defaultdict

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


def _graph(fabric: Fabric):
    switches = list(Switch.objects.filter(fabric=fabric, present=True).values_list("id", "description", "guid", "tier"))
    names = switch_names([(pk, d, g) for pk, d, g, _ in switches])
    tiers = {pk: tier for pk, _, _, tier in switches}
    hosts_of_leaf = defaultdict(set)
    neighbours = defaultdict(set)
    links = Link.objects.filter(fabric=fabric).exclude(state__in=[Link.State.MISSING, Link.State.DOWN]).values_list(
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


def topology_block(fabric: Fabric) -> str:
    names, tiers, hosts_of_leaf, _ = _graph(fabric)
    # Union-find over leaves that share a host: one block per connected group.
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
    blocks = defaultdict(set)
    for pk, hosts in hosts_of_leaf.items():
        blocks[find(pk)] |= hosts
    lines = [f"# Slurm topology.conf (block) for fabric {fabric.name}, written by FabricPool"]
    for root in sorted(blocks, key=lambda pk: names[pk]):
        lines.append(f"BlockName={names[root]} Nodes={compress(blocks[root])}")
    return "\n".join(lines) + "\n"
