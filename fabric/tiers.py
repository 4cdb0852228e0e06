"""Switch tiers inferred from the graph, not from names (names lie or say nothing).

Leaves carry adapters (SHARP aggregation nodes excepted: every switch has one); spines are
one switch hop above the nearest leaf; cores two or more. A switch that carries a few
adapters (a management or storage server plugged into a spine) but has more cables to two
or more adapter-carrying switches than it has adapters is a spine, not a leaf. This holds for 2- and 3-tier fat
trees, rail-optimized fabrics (every rail leaf carries adapters), oversubscribed trees and
trees with missing links (a switch keeps its tier while any path to a leaf remains).
A switch with no path to any leaf is `unknown`.
"""
from __future__ import annotations

from collections import defaultdict, deque

from .ibnetdiscover import SWITCH, Topology

LEAF, SPINE, CORE, UNKNOWN = "leaf", "spine", "core", "unknown"
TIERS = (LEAF, SPINE, CORE, UNKNOWN)


def infer_tiers(topo: Topology) -> dict[int, str]:
    """Map each switch GUID to its tier."""
    switches = {guid for guid, node in topo.nodes.items() if node.kind == SWITCH}
    neighbours: dict[int, set[int]] = defaultdict(set)
    cables: dict[tuple[int, int], int] = defaultdict(int)
    adapter_ports: dict[int, int] = defaultdict(int)
    leaves: set[int] = set()
    for link in topo.links:
        (ga, _), (gb, _) = link.a, link.b
        a_switch, b_switch = ga in switches, gb in switches
        if a_switch and b_switch:
            if ga != gb:
                neighbours[ga].add(gb)
                neighbours[gb].add(ga)
                cables[ga, gb] += 1
                cables[gb, ga] += 1
        elif a_switch or b_switch:
            sw, other = (ga, gb) if a_switch else (gb, ga)
            other_node = topo.nodes.get(other)
            if other_node is None:
                # A dangling far end: trust the type letter of the port line.
                if link.b_kind != SWITCH and other == link.b[0]:
                    leaves.add(sw)
                    adapter_ports[sw] += 1
            elif not other_node.is_aggregation_node:
                leaves.add(sw)
                adapter_ports[sw] += 1
    leaves -= {
        sw
        for sw in leaves
        if len(neighbours[sw] & leaves) >= 2
        and adapter_ports[sw] < sum(cables[sw, other] for other in neighbours[sw] & leaves)
    }
    distance = {guid: 0 for guid in leaves}
    queue = deque(leaves)
    while queue:
        current = queue.popleft()
        for nxt in neighbours[current]:
            if nxt not in distance:
                distance[nxt] = distance[current] + 1
                queue.append(nxt)
    tiers = {}
    for guid in switches:
        hops = distance.get(guid)
        tiers[guid] = UNKNOWN if hops is None else (LEAF, SPINE)[hops] if hops < 2 else CORE
    return tiers
