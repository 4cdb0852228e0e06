"""What a person checks after an import, as plain data (the `fabric_summary` command prints
it as JSON; its keys are documented in the README)."""
from __future__ import annotations

from collections import Counter, defaultdict

from .models import ChannelAdapter, Fabric, Link, Switch

ACTIVE_STATES = (Link.State.UP, Link.State.DEGRADED)


def fabric_summary(fabric: Fabric) -> dict:
    switches = {
        pk: (desc, tier, guid)
        for pk, desc, tier, guid in Switch.objects.filter(fabric=fabric, present=True).values_list("id", "description", "tier", "guid")
    }
    adapters = {
        pk: (host, aggregation)
        for pk, host, aggregation in ChannelAdapter.objects.filter(fabric=fabric, present=True).values_list(
            "id", "host_name", "is_aggregation_node"
        )
    }
    tiers = Counter(tier for _, tier, _ in switches.values())
    link_counts = Counter()
    state_counts = Counter()
    leaf_hosts: dict[int, set] = defaultdict(set)
    leaf_adapters: Counter = Counter()
    uplink: Counter = Counter()
    downlink: Counter = Counter()
    rows = Link.objects.filter(fabric=fabric).values_list(
        "kind", "state", "gbps", "port_a__switch_id", "port_a__adapter_id", "port_b__switch_id", "port_b__adapter_id"
    )
    for kind, state, gbps, a_sw, a_ad, b_sw, b_ad in rows:
        state_counts[state] += 1
        if state == Link.State.MISSING:
            continue
        link_counts[kind] += 1
        active = state in ACTIVE_STATES
        if kind == Link.Kind.SWITCH_SWITCH:
            for near, far in ((a_sw, b_sw), (b_sw, a_sw)):
                if near in switches and switches[near][1] == Switch.Tier.LEAF and far in switches and switches[far][1] != Switch.Tier.LEAF:
                    uplink[near] += (gbps or 0) if active else 0
        elif kind == Link.Kind.ADAPTER_SWITCH:
            sw, ad = (a_sw, b_ad) if a_sw else (b_sw, a_ad)
            if sw in switches and ad in adapters and not adapters[ad][1]:
                leaf_adapters[sw] += 1
                if adapters[ad][0]:
                    leaf_hosts[sw].add(adapters[ad][0])
                downlink[sw] += (gbps or 0) if active else 0
    hosts = {host for host, aggregation in adapters.values() if host and not aggregation}
    leaves = []
    for pk, (desc, tier, guid) in sorted(switches.items(), key=lambda item: (item[1][0], item[1][2])):
        if tier != Switch.Tier.LEAF:
            continue
        up, down = round(uplink[pk], 2), round(downlink[pk], 2)
        leaves.append(
            {
                "name": desc,
                "guid": f"0x{guid}",
                "hosts": sorted(leaf_hosts[pk]),
                "adapters": leaf_adapters[pk],
                "uplink_gbps": up,
                "downlink_gbps": down,
                "oversubscription": round(down / up, 2) if up else None,
            }
        )
    return {
        "fabric": fabric.name,
        "switches": {tier: tiers.get(tier, 0) for tier in Switch.Tier.values} | {"total": len(switches)},
        "adapters": len(adapters),
        "aggregation_nodes": sum(1 for _, aggregation in adapters.values() if aggregation),
        "unnamed_adapters": sum(1 for host, aggregation in adapters.values() if not host and not aggregation),
        "hosts": len(hosts),
        "links": {
            "switch_switch": link_counts[Link.Kind.SWITCH_SWITCH],
            "adapter_switch": link_counts[Link.Kind.ADAPTER_SWITCH],
            "adapter_adapter": link_counts[Link.Kind.ADAPTER_ADAPTER],
            "loopback": link_counts[Link.Kind.LOOPBACK],
            "dangling": link_counts[Link.Kind.DANGLING],
            "up": state_counts[Link.State.UP],
            "degraded": state_counts[Link.State.DEGRADED],
            "down": state_counts[Link.State.DOWN],
            "missing": state_counts[Link.State.MISSING],
        },
        "leaves": leaves,
    }
