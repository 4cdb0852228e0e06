"""Kubernetes node labels for topology-aware scheduling (Kueue's Topology levels,
KAI-Scheduler's topology, GKE's gce-topology-* style): per host, three levels.

block  the pod: leaves joined through spines (the whole fabric in a 2-tier fat tree), named
       after its first spine (or its rack when no spine is known);
rack   the leaf switch (on a rail-optimized fabric, the group of rail leaves the host's
       scalable unit shares, named after its first leaf), as in `topology.conf` block form;
host   the host itself.

Values are valid label values: at most 63 characters of [A-Za-z0-9._-], starting and ending
alphanumeric; names that need changing get a short hash, so two switches never share a value.
Down or degraded links still count (topology is structure, not health); missing ones do not.
"""
from __future__ import annotations

import hashlib
import re
from collections import defaultdict

from .models import ChannelAdapter, Fabric, Link, Switch
from .slurm import _graph, leaf_groups

LEVELS = ("block", "rack", "host")
STYLES = {
    # style -> key of each level (a prefix is put in front of the fabricpool style's names)
    "fabricpool": {"block": "topology-block", "rack": "topology-rack", "host": "topology-host"},
    "gce": {"block": "cloud.google.com/gce-topology-block", "rack": "cloud.google.com/gce-topology-subblock",
            "host": "cloud.google.com/gce-topology-host"},
}
DEFAULT_PREFIX = "fabricpool.io/"
_VALUE_OK = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
_PREFIX_OK = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class LabelError(ValueError):
    pass


def label_keys(style: str = "fabricpool", prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """Level -> label key; the prefix (a DNS subdomain, '/' optional) applies to the
    fabricpool style only."""
    if style not in STYLES:
        raise LabelError(f"unknown style {style!r} (known: {', '.join(STYLES)})")
    if style != "fabricpool":
        return dict(STYLES[style])
    domain = prefix.rstrip("/")
    if domain and (len(domain) > 253 or not _PREFIX_OK.match(domain)):
        raise LabelError(f"prefix {prefix!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.', "
                         "e.g. 'fabricpool.io/')")
    return {level: f"{domain}/{name}" if domain else name for level, name in STYLES[style].items()}


def valid_value(value: str) -> bool:
    return bool(_VALUE_OK.match(value))


def label_values(names) -> dict[str, str]:
    """Name -> a valid, distinct label value. Valid names stay as they are; others have
    bad characters replaced and ends trimmed, and get the first 8 hex digits of the name's
    SHA-256 appended (trimmed to 63 characters), so that two names practically never meet."""
    out = {}
    for name in names:
        if valid_value(name) and name:
            out[name] = name
            continue
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]  # a tag, not a secret
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:54].rstrip("-._")
        out[name] = f"{base}-{digest}" if base else f"x-{digest}"
    return out


def topology_labels(fabric: Fabric, keys: dict[str, str]) -> dict[str, dict[str, str]]:
    """Host -> {label key: value} for every host with an adapter in the fabric. Raises
    LabelError naming the hosts that hang off no switch."""
    names, tiers, hosts_of_leaf, neighbours = _graph(fabric, skip_states=(Link.State.MISSING,))
    hosts = set(ChannelAdapter.objects.filter(fabric=fabric, present=True, kind=ChannelAdapter.Kind.CA,
                                              is_aggregation_node=False)
                .exclude(host_name="").values_list("host_name", flat=True))
    leaves_of = defaultdict(set)
    for leaf, leaf_hosts in hosts_of_leaf.items():
        for host in leaf_hosts:
            leaves_of[host].add(leaf)
    lost = sorted(hosts - set(leaves_of))
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        raise LabelError(f"{len(lost)} host(s) of fabric {fabric.name!r} have no leaf switch (no cable to a switch "
                         f"that is not missing): {shown}; fix the cabling or the discovery, nothing was printed")

    rack_of_leaf = leaf_groups(names, hosts_of_leaf)
    # Pods: leaves joined through a spine or through a host (rails); named after the first spine.
    parent = {pk: pk for pk in hosts_of_leaf}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    spines = [pk for pk, tier in tiers.items() if tier == Switch.Tier.SPINE]
    for pk in spines:
        below = [n for n in neighbours[pk] if n in parent]
        for leaf in below[1:]:
            parent[find(leaf)] = find(below[0])
    for leaf, rack in rack_of_leaf.items():
        parent[find(leaf)] = find(rack)
    spines_of_pod = defaultdict(set)
    for pk in spines:
        for leaf in neighbours[pk]:
            if leaf in parent:
                spines_of_pod[find(leaf)].add(names[pk])

    def first_leaf(host):
        return min(leaves_of[host], key=lambda pk: names[pk])

    def rack_name(host):
        return names[rack_of_leaf[first_leaf(host)]]

    def block_name(host):
        pod = find(first_leaf(host))
        return min(spines_of_pod[pod]) if spines_of_pod[pod] else rack_name(host)

    raw = {host: {"block": block_name(host), "rack": rack_name(host), "host": host} for host in sorted(hosts)}
    values = {level: label_values({row[level] for row in raw.values()}) for level in LEVELS}
    return {host: {keys[level]: values[level][row[level]] for level in LEVELS} for host, row in raw.items()}
