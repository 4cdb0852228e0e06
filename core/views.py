from datetime import datetime
from datetime import timezone as dt_timezone

from django.shortcuts import render
from django.urls import reverse

from fabric.models import Fabric
from fabric.selectors import STATES, TIER_ORDER, fabric_counts
from pool.models import Host
from pool.selectors import NO_POOL

from . import live_snapshots


def _reason_labels() -> dict:
    from scheduler.selectors import REASON_LABELS  # the scheduler's words for why a job waits

    return dict(REASON_LABELS)


def overview(request):
    """Counts per fabric and for the pool; every number links to the list behind it."""
    counts = fabric_counts()
    fabrics = [{"fabric": fabric, "counts": counts[fabric.pk]} for fabric in Fabric.objects.all()]
    # The live view's snapshot: the page shows it at once, static/js/overview.js keeps it current.
    live = live_snapshots.overview()
    host_states = live["hosts"]
    context = {
        "fabrics": fabrics,
        "tiers": TIER_ORDER,
        "states": STATES,
        "hosts_total": sum(host_states.values()),
        "host_states": [(state, label, host_states.get(state, 0)) for state, label in Host.State.choices],
        "gpus_total": sum(p["total"] for p in live["gpu_pools"]),
    }
    history = live_snapshots.utilization_history()
    context.update(
        live=live,
        history=history,
        history_rows=[(datetime.fromtimestamp(t / 1000, tz=dt_timezone.utc), u) for t, u in zip(history["t"], history["mean"])],
        gpu_tables=[("GPUs per pool", "pool", live["gpu_pools"]), ("GPUs per site", "site", live["gpu_sites"])],
        hosts_not_up=sum(n for state, n in host_states.items() if state != Host.State.UP),
        reason_labels=_reason_labels(),
        overview_config={"pool_url": reverse("pool:index"), "jobs_url": reverse("scheduler:jobs"),
                         "cycle_url": reverse("scheduler:cycle", args=[0])[:-2], "reasons": _reason_labels(),
                         "no_pool": NO_POOL, "host_states": [state for state, _ in Host.State.choices]},
    )
    return render(request, "core/overview.html", context)
