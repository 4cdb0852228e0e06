"""Data for the topology and GPU heatmap pages, built from the database in a fixed number of
queries whatever the size of the fabric (a 4,096-host fat tree is about ten queries).

The topology is laid out as rows: hosts at the bottom (y=0) in leaf order, leaves above
the middle of their hosts, spines and cores spread evenly above. Everything is plain JSON
(lists and numbers) so that the page embeds it with json_script and the JSON endpoints
return the very same thing; the browser only draws it. Names are sent as stored: the
scripts escape them before plotly sees them (plotly reads text as markup).
"""
from __future__ import annotations

from collections import defaultdict
from urllib.parse import quote

from django.urls import reverse

from fabric.fattree import natural_key
from fabric.models import Fabric, Link, Switch
from pool.models import Gpu, Host
from pool.selectors import busy_threshold
from scheduler.models import Placement, PlacementGpu

COLORS = ("utilization", "tenant")
LINK_COLORS = ("health", "utilization")
METRICS = {
    "utilization": {"label": "GPU utilization", "unit": "%", "zmin": 0, "zmax": 100},
    "memory": {"label": "GPU memory used", "unit": "%", "zmin": 0, "zmax": 100},
    "temperature": {"label": "GPU temperature", "unit": "°C", "zmin": 20, "zmax": 95},
}
# Above this many hosts the page starts with one marker per leaf (count, mean utilization);
# a leaf expands on click and hosts appear when the view is zoomed in to this many or fewer.
AGGREGATE_ABOVE = 512
TIER_ROWS = {"core": 3, "spine": 2, "leaf": 1, "unknown": 4}
HOST_ROW = 0
# Link utilization buckets (share of the link's rate), lowest first.
UTIL_BUCKETS = [(0.25, "0-25 %"), (0.5, "25-50 %"), (0.75, "50-75 %"), (float("inf"), "75-100 %")]
NO_LEAF = "(no leaf)"


class BadParameter(ValueError):
    """A query parameter the pages cannot use; the message says which and why."""


def pick_fabric(name: str) -> Fabric | None:
    """The named fabric, or the first one when no name is given (None when there is none)."""
    if not name:
        return Fabric.objects.order_by("name").first()
    fabric = Fabric.objects.filter(name=name).first()
    if fabric is None:
        known = list(Fabric.objects.order_by("name").values_list("name", flat=True)[:20])
        raise BadParameter(f"Unknown fabric {name!r}: choose one of {', '.join(known) or '(none yet)'}.")
    return fabric


def check_choice(value: str, choices, what: str) -> str:
    if value not in choices:
        raise BadParameter(f"Unknown {what} {value!r}: choose one of {', '.join(choices)}.")
    return value


def _host_url_prefix() -> str:
    # reverse() once and append quoted names: 4,096 reverse() calls cost more than the queries.
    return reverse("pool:host", args=["x"])[:-2]


def _switch_url_template(fabric: Fabric) -> str:
    return reverse("fabric:switch", args=[fabric.name, "0" * 16])[: -17]


# --- what both pages share ---------------------------------------------------------------


def _layout(fabric: Fabric):
    """Switches, the cables drawn (switch-switch, adapter-switch) and which host owns which adapter.

    Returns (switches {id: row}, links [rows], {adapter id: [switch ids]},
    {host id: [adapter ids]}). Three queries."""
    switches = {
        row["id"]: row
        for row in Switch.objects.filter(fabric=fabric).values("id", "guid", "description", "tier", "present").order_by()
    }
    links = list(
        Link.objects.filter(fabric=fabric, kind__in=[Link.Kind.SWITCH_SWITCH, Link.Kind.ADAPTER_SWITCH])
        .values("id", "kind", "state", "state_reason", "gbps", "port_a__switch_id", "port_b__switch_id",
                "port_a__adapter_id", "port_b__adapter_id", "port_a__number", "port_b__number")
        .order_by()
    )
    adapter_leaf: dict[int, list[int]] = defaultdict(list)
    for link in links:
        if link["kind"] == Link.Kind.ADAPTER_SWITCH:
            if link["port_a__adapter_id"] is not None:
                adapter, switch = link["port_a__adapter_id"], link["port_b__switch_id"]
            else:
                adapter, switch = link["port_b__adapter_id"], link["port_a__switch_id"]
            link["adapter"], link["switch"] = adapter, switch
            adapter_leaf[adapter].append(switch)
    through = Host.adapters.through
    host_adapters = defaultdict(list)
    for host_id, adapter_id in through.objects.filter(host__fabric=fabric).values_list("host_id", "channeladapter_id"):
        host_adapters[host_id].append(adapter_id)
    return switches, links, adapter_leaf, host_adapters


def _ordered_hosts(fabric, switches, adapter_leaf, host_adapters):
    """Hosts grouped by leaf (leaves in natural name order, hosts by name within a leaf);
    a host on several leaves (rails) sits under the first. One query."""
    hosts = list(
        Host.objects.filter(fabric=fabric)
        .values("id", "name", "state", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s")
        .order_by()
    )
    leaf_order = sorted(
        (pk for pk, s in switches.items() if s["tier"] == Switch.Tier.LEAF),
        key=lambda pk: (natural_key(switches[pk]["description"]), switches[pk]["guid"]),
    )
    rank = {pk: i for i, pk in enumerate(leaf_order)}
    for host in hosts:
        leaves = {leaf for a in host_adapters.get(host["id"], ()) for leaf in adapter_leaf.get(a, ()) if leaf in rank}
        host["leaves"] = sorted(leaves, key=rank.get)
        host["leaf"] = host["leaves"][0] if host["leaves"] else None
    hosts.sort(key=lambda h: (rank.get(h["leaf"], len(rank)), natural_key(h["name"])))
    return leaf_order, hosts


def _gpus_by_host(fabric) -> dict[int, list[dict]]:
    """Present GPUs of the fabric's hosts, by host id, in index order. One query."""
    gpus = defaultdict(list)
    rows = (
        Gpu.objects.filter(host__fabric=fabric, present=True)
        .values("id", "host_id", "index", "model", "utilization", "memory_used_mib", "memory_mib", "temperature_c")
        .order_by("host_id", "index")
    )
    for row in rows:
        gpus[row["host_id"]].append(row)
    return gpus


def _tenants_by_gpu(fabric) -> dict[int, tuple[str, int]]:
    """{gpu id: (tenant, placement id)} for GPUs held by an active placement. One query."""
    rows = PlacementGpu.objects.filter(
        active=True, gpu__host__fabric=fabric, placement__state__in=Placement.ACTIVE_STATES
    ).values_list("gpu_id", "placement__job__tenant__name", "placement_id")
    return {gpu: (tenant, placement) for gpu, tenant, placement in rows}


def highlight_placement(value: str) -> Placement | None:
    """The placement named by ?highlight=, or None when not given."""
    if not value:
        return None
    if not value.isdigit():
        raise BadParameter(f"highlight={value!r} is not a placement number.")
    placement = Placement.objects.select_related("job__tenant").filter(pk=int(value)).first()
    if placement is None:
        raise BadParameter(f"There is no placement {value}.")
    return placement


def placement_fabric(placement: Placement) -> Fabric | None:
    """The fabric of the placement's hosts (the first by name when it spans several)."""
    return Fabric.objects.filter(hosts__gpus__placement_gpus__placement=placement).order_by("name").first()


def _mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 1) if values else None


# --- topology ---------------------------------------------------------------------------------


def topology_data(fabric: Fabric, color: str = "utilization", links: str = "health",
                  placement: Placement | None = None, aggregate_above: int = AGGREGATE_ABOVE) -> dict:
    check_choice(color, COLORS, "colour")
    check_choice(links, LINK_COLORS, "link colouring")
    switches, link_rows, adapter_leaf, host_adapters = _layout(fabric)
    leaf_order, hosts = _ordered_hosts(fabric, switches, adapter_leaf, host_adapters)
    gpus = _gpus_by_host(fabric)
    tenants = _tenants_by_gpu(fabric)
    threshold = busy_threshold()
    highlighted_gpus: set[int] = set()
    if placement is not None:
        highlighted_gpus = set(PlacementGpu.objects.filter(placement=placement).values_list("gpu_id", flat=True))

    # Hosts, one column per field (a 4,096-host fabric is ~0.5 MB of JSON this way).
    # "id": the host's key in the live updates (core.live_snapshots.topology_hosts).
    cols = {key: [] for key in ("id", "name", "url", "x", "leaf", "state", "gpus", "busy", "util", "tenant", "ib_gbps",
                                "highlight")}
    prefix = _host_url_prefix()
    leaf_hosts: dict[int | None, list[int]] = defaultdict(list)
    host_index = {}
    for i, host in enumerate(hosts):
        own = gpus.get(host["id"], [])
        held = [tenants[g["id"]][0] for g in own if g["id"] in tenants]
        ib = [v for v in (host["ib_tx_bytes_per_s"], host["ib_rx_bytes_per_s"]) if v is not None]
        cols["id"].append(host["id"])
        cols["name"].append(host["name"])
        cols["url"].append(prefix + quote(host["name"], safe="/") + "/")
        cols["x"].append(i)
        cols["leaf"].append(host["leaf"])
        cols["state"].append(host["state"])
        cols["gpus"].append(len(own))
        cols["busy"].append(sum(1 for g in own if (g["utilization"] or 0) >= threshold))
        cols["util"].append(_mean(g["utilization"] for g in own))
        # The tenant holding most of the host's GPUs; ties go to the first name.
        cols["tenant"].append(max(sorted(set(held)), key=held.count) if held else None)
        cols["ib_gbps"].append(round(sum(ib) * 8 / 1e9, 2) if ib else None)
        cols["highlight"].append(any(g["id"] in highlighted_gpus for g in own))
        leaf_hosts[host["leaf"]].append(i)
        host_index[host["id"]] = i

    # Switch positions: leaves over their hosts, the other tiers spread evenly.
    width = max(len(hosts) - 1, 1)
    pos = {}
    for n, pk in enumerate(leaf_order):
        xs = leaf_hosts.get(pk)
        pos[pk] = (sum(xs) / len(xs)) if xs else n * width / max(len(leaf_order) - 1, 1)
    by_tier = defaultdict(list)
    for pk, s in switches.items():
        if s["tier"] != Switch.Tier.LEAF:
            by_tier[s["tier"]].append(pk)
    for tier, pks in by_tier.items():
        pks.sort(key=lambda pk: (natural_key(switches[pk]["description"]), switches[pk]["guid"]))
        for n, pk in enumerate(pks):
            pos[pk] = (n + 0.5) * (width + 1) / len(pks) - 0.5

    # Host traffic per leaf, spread over its up uplinks: an estimate of uplink load (the
    # switches' own counters are not read per poll yet).
    leaf_traffic = {pk: sum(cols["ib_gbps"][i] or 0 for i in idx) for pk, idx in leaf_hosts.items()
                    if any(cols["ib_gbps"][i] is not None for i in idx)}
    uplinks = defaultdict(int)
    for link in link_rows:
        if link["kind"] == Link.Kind.SWITCH_SWITCH and link["state"] == Link.State.UP:
            for end in ("port_a__switch_id", "port_b__switch_id"):
                if switches.get(link[end], {}).get("tier") == Switch.Tier.LEAF:
                    uplinks[link[end]] += 1

    switch_index = {}
    switch_list = []
    order = leaf_order + [pk for tier in ("spine", "core", "unknown") for pk in by_tier.get(tier, [])]
    url_prefix = _switch_url_template(fabric)
    for pk in order:
        s = switches[pk]
        idx = leaf_hosts.get(pk, [])
        utils = [cols["util"][i] for i in idx if cols["util"][i] is not None]
        switch_index[pk] = len(switch_list)
        switch_list.append({
            "guid": s["guid"], "name": s["description"], "tier": s["tier"], "present": s["present"],
            "x": round(pos[pk], 2), "y": TIER_ROWS.get(s["tier"], 4), "url": f"{url_prefix}{s['guid']}/",
            "hosts": len(idx), "gpus": sum(cols["gpus"][i] for i in idx), "busy": sum(cols["busy"][i] for i in idx),
            "util": round(sum(utils) / len(utils), 1) if utils else None,
            "highlight": any(cols["highlight"][i] for i in idx),
        })
    cols["leaf"] = [switch_index.get(pk) for pk in cols["leaf"]]

    groups = _link_groups(links, link_rows, switches, pos, switch_index, switch_list, host_adapters, hosts,
                          host_index, cols, leaf_traffic, uplinks)
    tenant_counts = defaultdict(int)
    for t in cols["tenant"]:
        if t:
            tenant_counts[t] += 1
    rows = [{"tier": tier, "y": y, "count": sum(1 for s in switch_list if s["tier"] == tier)}
            for tier, y in TIER_ROWS.items()]
    return {
        "fabric": fabric.name,
        "color": color,
        "links_color": links,
        "busy_threshold": threshold,
        "rows": [r for r in rows if r["count"]] + [{"tier": "hosts", "y": HOST_ROW, "count": len(hosts)}],
        "switches": switch_list,
        "hosts": cols,
        "aggregated": len(hosts) > aggregate_above,
        "aggregate_above": aggregate_above,
        "links": groups,
        "tenants": [{"name": t, "hosts": n} for t, n in sorted(tenant_counts.items())],
        "highlight": _highlight(placement, cols) if placement is not None else None,
    }


def _link_groups(mode, link_rows, switches, pos, switch_index, switch_list, host_adapters, hosts, host_index,
                 cols, leaf_traffic, uplinks) -> list[dict]:
    """Link segments grouped by colour: by state (health) or by utilization bucket. Each
    group is one WebGL line trace (segments of 3 points: two ends and a null); links not up also get a
    hover point at their middle, with the reason."""
    adapter_host = {a: h for h, adapters in host_adapters.items() for a in adapters}
    groups: dict[str, dict] = {}
    problems = []

    def add(key, label, x0, y0, x1, y1, host, link_id):
        group = groups.setdefault(key, {"key": key, "label": label, "count": 0, "x": [], "y": [], "host": [], "link": []})
        group["count"] += 1
        group["x"] += [round(x0, 2), round(x1, 2), None]
        group["y"] += [y0, y1, None]
        group["host"].append(host)  # the host of a host cable (hidden while its leaf is folded)
        group["link"].append(link_id)  # its key in the live updates (core.live_snapshots.topology_links)

    for link in link_rows:
        if link["kind"] == Link.Kind.SWITCH_SWITCH:
            a, b = link["port_a__switch_id"], link["port_b__switch_id"]
            if a not in switch_index or b not in switch_index:
                continue
            ends = [(pos[a], switch_list[switch_index[a]]["y"]), (pos[b], switch_list[switch_index[b]]["y"])]
            names = [switches[a]["description"], switches[b]["description"]]
            leaf = a if switches[a]["tier"] == Switch.Tier.LEAF else b if switches[b]["tier"] == Switch.Tier.LEAF else None
            traffic = leaf_traffic.get(leaf)
            gbps_used = traffic / uplinks[leaf] if traffic is not None and uplinks[leaf] else None
            host = None
        else:
            host = host_index.get(adapter_host.get(link["adapter"]))
            switch = link["switch"]
            if host is None or switch not in switch_index:
                continue
            ends = [(cols["x"][host], HOST_ROW), (pos[switch], switch_list[switch_index[switch]]["y"])]
            names = [cols["name"][host], switches[switch]["description"]]
            gbps_used = cols["ib_gbps"][host]
        if mode == "health":
            key = label = link["state"]
        elif link["state"] != Link.State.UP:
            key, label = "unusable", "not up"
        elif gbps_used is None or not link["gbps"]:
            key, label = "unknown", "no traffic data"
        else:
            share = gbps_used / link["gbps"]
            key = label = next(lab for limit, lab in UTIL_BUCKETS if share < limit)
        add(key, label, ends[0][0], ends[0][1], ends[1][0], ends[1][1], host, link["id"])
        if link["state"] != Link.State.UP:
            problems.append({"link": link["id"],
                "x": round((ends[0][0] + ends[1][0]) / 2, 2), "y": (ends[0][1] + ends[1][1]) / 2,
                "state": link["state"], "reason": link["state_reason"], "a": names[0], "b": names[1],
            })
    order = ["up", "degraded", "down", "missing"] + [label for _, label in UTIL_BUCKETS] + ["unknown", "unusable"]
    result = sorted(groups.values(), key=lambda g: order.index(g["key"]) if g["key"] in order else len(order))
    return {"groups": result, "problems": problems}


def _highlight(placement: Placement, cols) -> dict:
    names = [name for name, lit in zip(cols["name"], cols["highlight"]) if lit]
    return {
        "placement": placement.pk, "job": placement.job_id, "tenant": placement.job.tenant.name,
        "state": placement.state, "hosts": names,
        "url": reverse("scheduler:placement", args=[placement.pk]),
    }


# --- heatmap ---------------------------------------------------------------------------------


def heatmap_data(fabric: Fabric, metric: str = "utilization") -> dict:
    """Hosts (columns, grouped by leaf) × GPU index (rows): the metric of each present GPU,
    None where a host has no such GPU or no reading."""
    check_choice(metric, METRICS, "metric")
    switches, _links, adapter_leaf, host_adapters = _layout(fabric)
    leaf_order, hosts = _ordered_hosts(fabric, switches, adapter_leaf, host_adapters)
    gpus = _gpus_by_host(fabric)
    rows = max((g["index"] for own in gpus.values() for g in own), default=-1) + 1
    z = [[None] * len(hosts) for _ in range(rows)]
    prefix = _host_url_prefix()
    leaves: list[dict] = []
    for col, host in enumerate(hosts):
        name = switches[host["leaf"]]["description"] if host["leaf"] is not None else NO_LEAF
        if not leaves or leaves[-1]["name"] != name:
            leaves.append({"name": name, "guid": switches[host["leaf"]]["guid"] if host["leaf"] else None,
                           "start": col, "count": 0})
        leaves[-1]["count"] += 1
        for g in gpus.get(host["id"], []):
            z[g["index"]][col] = _metric(g, metric)
    return {
        "fabric": fabric.name,
        "metric": metric,
        **METRICS[metric],
        "hosts": [h["name"] for h in hosts],
        "urls": [prefix + quote(h["name"], safe="/") + "/" for h in hosts],
        "gpus": list(range(rows)),
        "leaves": leaves,
        "z": z,
        "cells": sum(1 for row in z for v in row if v is not None),
    }


def _metric(gpu: dict, metric: str):
    if metric == "utilization":
        value = gpu["utilization"]
    elif metric == "temperature":
        value = gpu["temperature_c"]
    else:
        used, total = gpu["memory_used_mib"], gpu["memory_mib"]
        value = used * 100 / total if used is not None and total else None
    return None if value is None else round(value, 1)
