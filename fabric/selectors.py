"""Read-side queries shared by the dashboard pages and the admin."""
from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Q

from .models import ChannelAdapter, Fabric, Link, Switch

TIER_ORDER = [Switch.Tier.LEAF, Switch.Tier.SPINE, Switch.Tier.CORE, Switch.Tier.UNKNOWN]
STATES = [Link.State.UP, Link.State.DEGRADED, Link.State.DOWN, Link.State.MISSING]


def fabric_counts(fabric: Fabric | None = None) -> dict[int, dict]:
    """Per fabric id: present switches by tier, adapters, hosts, links by state. Four
    grouped queries whatever the number of fabrics or links."""
    counts: dict[int, dict] = defaultdict(
        lambda: {
            "tiers": {tier: 0 for tier in TIER_ORDER},
            "switches": 0,
            "adapters": 0,
            "hosts": 0,
            "links": {state: 0 for state in STATES},
            "links_total": 0,
        }
    )
    where = {"fabric": fabric} if fabric is not None else {}
    # order_by() drops the models' default ordering, which would otherwise join GROUP BY.
    for row in Switch.objects.filter(present=True, **where).values("fabric_id", "tier").annotate(n=Count("id")).order_by():
        entry = counts[row["fabric_id"]]
        entry["tiers"][row["tier"]] = row["n"]
        entry["switches"] += row["n"]
    host_filter = Q(is_aggregation_node=False) & ~Q(host_name="")
    adapters = (
        ChannelAdapter.objects.filter(present=True, **where)
        .values("fabric_id")
        .annotate(n=Count("id"), hosts=Count("host_name", filter=host_filter, distinct=True))
        .order_by()
    )
    for row in adapters:
        counts[row["fabric_id"]].update(adapters=row["n"], hosts=row["hosts"])
    for row in Link.objects.filter(**where).values("fabric_id", "state").annotate(n=Count("id")).order_by():
        entry = counts[row["fabric_id"]]
        entry["links"][row["state"]] = row["n"]
        entry["links_total"] += row["n"]
    return counts
