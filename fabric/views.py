"""Fabric pages: the fabrics, one fabric's switches by tier, a switch's ports and links, the
links and adapters lists. Every list is paginated and built from a fixed number of
grouped queries, so a Selene-size fabric (666 switches, 13k links) renders as fast as a
lab one."""
from __future__ import annotations

from collections import defaultdict

from django.core.paginator import Paginator
from django.db.models import Case, Count, F, IntegerField, Q, Value, When
from django.shortcuts import get_object_or_404, redirect, render

from .models import ChannelAdapter, Fabric, FabricEvent, Link, Port, Switch, normalize_guid
from .selectors import STATES, TIER_ORDER, fabric_counts

PAGE_SIZE = 100
RECENT_EVENTS = 20


def _bad_filter(request, template, context, message):
    """Unknown filter values get the page back with a clear message, not a 500 or a silent
    empty list."""
    context["error"] = message
    return render(request, template, context, status=400)


def index(request):
    fabrics = list(Fabric.objects.select_related("site"))
    counts = fabric_counts()
    rows = [{"fabric": fabric, "counts": counts[fabric.pk]} for fabric in fabrics]
    return render(request, "fabric/index.html", {"rows": rows, "tiers": TIER_ORDER, "states": STATES})


def _switch_health(switch_ids) -> dict[int, dict]:
    """Links per switch by state, two grouped queries for a page of switches. A loopback
    cable (both ends on one switch) counts once."""
    health = {pk: {"total": 0, **{state: 0 for state in STATES}} for pk in switch_ids}
    side_a = Link.objects.filter(port_a__switch_id__in=switch_ids).values("port_a__switch_id", "state")
    side_b = (
        Link.objects.filter(port_b__switch_id__in=switch_ids)
        .exclude(port_a__switch_id=F("port_b__switch_id"))
        .values("port_b__switch_id", "state")
    )
    for query, key in ((side_a, "port_a__switch_id"), (side_b, "port_b__switch_id")):
        for row in query.annotate(n=Count("id")).order_by():
            entry = health[row[key]]
            entry[row["state"]] += row["n"]
            entry["total"] += row["n"]
    return health


def fabric_detail(request, name):
    fabric = get_object_or_404(Fabric.objects.select_related("site"), name=name)
    tier = request.GET.get("tier", "")
    context = {
        "fabric": fabric,
        "counts": fabric_counts(fabric)[fabric.pk],
        "tiers": TIER_ORDER,
        "states": STATES,
        "tier": tier,
        "events": FabricEvent.objects.filter(fabric=fabric)
        .select_related("switch")
        .only("created_at", "kind", "severity", "message", "switch__guid", "switch__description")[:RECENT_EVENTS],
    }
    if tier and tier not in Switch.Tier.values:
        return _bad_filter(request, "fabric/detail.html", context, f"Unknown tier {tier!r}: choose one of {', '.join(TIER_ORDER)}.")
    switches = Switch.objects.filter(fabric=fabric)
    if tier:
        switches = switches.filter(tier=tier)
    tier_rank = Case(*[When(tier=t, then=Value(i)) for i, t in enumerate(TIER_ORDER)], output_field=IntegerField())
    switches = switches.annotate(tier_rank=tier_rank).order_by("tier_rank", "description", "guid")
    page = Paginator(switches.values("id", "guid", "description", "tier", "lid", "num_ports", "present"), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    health = _switch_health([row["id"] for row in page])
    groups: list[dict] = []
    for row in page:
        row["health"] = health[row["id"]]
        if not groups or groups[-1]["tier"] != row["tier"]:
            groups.append({"tier": row["tier"], "switches": []})
        groups[-1]["switches"].append(row)
    context.update(page=page, groups=groups)
    return render(request, "fabric/detail.html", context)


def _end(number, switch_guid, switch_desc, adapter_id, adapter_desc, host_name):
    """One end of a cable as the templates show it."""
    if number is None:
        return None
    return {
        "number": number,
        "switch_guid": switch_guid,
        "adapter_id": adapter_id,
        "description": switch_desc if switch_guid else adapter_desc,
        "host_name": host_name or "",
    }


LINK_END_FIELDS = (
    "port_{s}_id",
    "port_{s}__number",
    "port_{s}__switch__guid",
    "port_{s}__switch__description",
    "port_{s}__adapter_id",
    "port_{s}__adapter__description",
    "port_{s}__adapter__host_name",
)
LINK_FIELDS = ["id", "kind", "width", "speed", "gbps", "state", "state_reason", "last_seen", "remote_guid", "remote_port", "remote_description"]


def _link_query(queryset):
    """The columns the link tables show, both ends joined in one query."""
    return queryset.values(*LINK_FIELDS, *[f.format(s=side) for side in "ab" for f in LINK_END_FIELDS])


def _link_values(queryset) -> list[dict]:
    """Links with both ends described. A dangling link's far end is known only by the
    GUID and port its neighbour reported."""
    rows = []
    for row in queryset if isinstance(queryset, list) else _link_query(queryset):
        for side in "ab":
            row[side] = _end(*(row[f.format(s=side)] for f in LINK_END_FIELDS[1:]))
        if row["b"] is None:
            row["b"] = {"number": row["remote_port"], "switch_guid": None, "adapter_id": None,
                        "description": row["remote_description"] or f"0x{row['remote_guid']}", "host_name": ""}
        rows.append(row)
    return rows


def switch_detail(request, name, guid):
    normalized = normalize_guid(guid)
    if normalized is None:
        return render(request, "fabric/not_found.html", {"message": f"{guid!r} is not a GUID."}, status=404)
    if normalized != guid:
        return redirect("fabric:switch", name=name, guid=normalized)
    switch = get_object_or_404(Switch.objects.select_related("fabric"), fabric__name=name, guid=normalized)
    ports = list(Port.objects.filter(switch=switch).order_by("number").values("id", "number", "guid", "lid", "state"))
    port_ids = {p["id"] for p in ports}
    by_port = defaultdict(list)
    links = Link.objects.filter(Q(port_a_id__in=port_ids) | Q(port_b_id__in=port_ids)).order_by("key")
    for row in _link_values(links):
        # Seen from this switch the far end is the other one; a loopback cable (both ends
        # here) shows on both of its ports.
        if row["port_a_id"] in port_ids:
            by_port[row["port_a_id"]].append({**row, "far": row["b"]})
        if row["port_b_id"] in port_ids:
            by_port[row["port_b_id"]].append({**row, "far": row["a"]})
    for port in ports:
        port["links"] = by_port.get(port["id"], [])
    health = _switch_health([switch.pk])[switch.pk]
    return render(request, "fabric/switch.html", {"fabric": switch.fabric, "switch": switch, "ports": ports, "health": health, "states": STATES})


def link_list(request, name):
    fabric = get_object_or_404(Fabric, name=name)
    state, kind = request.GET.get("state", ""), request.GET.get("kind", "")
    context = {"fabric": fabric, "state": state, "kind": kind, "states": STATES, "kinds": Link.Kind.choices}
    if state and state not in Link.State.values:
        return _bad_filter(request, "fabric/links.html", context, f"Unknown link state {state!r}: choose one of {', '.join(STATES)}.")
    if kind and kind not in Link.Kind.values:
        return _bad_filter(request, "fabric/links.html", context, f"Unknown link kind {kind!r}: choose one of {', '.join(Link.Kind.values)}.")
    links = Link.objects.filter(fabric=fabric)
    if state:
        links = links.filter(state=state)
    if kind:
        links = links.filter(kind=kind)
    page = Paginator(_link_query(links.order_by("key")), PAGE_SIZE).get_page(request.GET.get("page"))
    rows = _link_values(list(page))
    context.update(page=page, links=rows)
    return render(request, "fabric/links.html", context)


def adapter_list(request, name):
    fabric = get_object_or_404(Fabric, name=name)
    adapters = ChannelAdapter.objects.filter(fabric=fabric).order_by("host_name", "description", "guid")
    page = Paginator(
        adapters.values("id", "guid", "description", "host_name", "kind", "is_aggregation_node", "present"), PAGE_SIZE
    ).get_page(request.GET.get("page"))
    rows = {row["id"]: {**row, "links": []} for row in page}
    links = Link.objects.filter(Q(port_a__adapter_id__in=rows) | Q(port_b__adapter_id__in=rows)).order_by("key")
    for row in _link_values(links):
        for near, far in (("a", "b"), ("b", "a")):
            if row[near]["adapter_id"] in rows:
                rows[row[near]["adapter_id"]]["links"].append({**row, "near": row[near], "far": row[far]})
    return render(request, "fabric/adapters.html", {"fabric": fabric, "page": page, "adapters": list(rows.values())})

