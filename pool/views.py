"""Pool pages: the pools and the host list (filtered, paginated, a fixed number of
queries), one host with its GPUs, adapters, events and charts, and the operator's drain and
undrain buttons. Reads go through pool.selectors, state changes through pool.services."""
from __future__ import annotations

import json

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from . import selectors
from fabric.models import Site

from .models import Host
from .services import drain_host, undrain_host

PAGE_SIZE = 100
DRAIN_PERMISSION = "pool.drain_host"
MAX_REASON = 200
# (div id, caption): the charts static/js/pool-charts.js draws, in page order.
CHART_PANELS = [
    ("gpu-utilization", "GPU utilization (%)"),
    ("gpu-memory", "GPU memory used (GiB)"),
    ("gpu-temperature", "GPU temperature (°C)"),
    ("gpu-power", "GPU power (W)"),
    ("host-cpu", "Host CPU (%)"),
    ("host-ib", "InfiniBand throughput (Gb/s)"),
]


def _gbps(bytes_per_s) -> str:
    """A throughput as InfiniBand people read it: bits per second."""
    if bytes_per_s is None:
        return ""
    bits = bytes_per_s * 8
    for unit, scale in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.2f} {unit}"
    return f"{bits:.0f} b/s"


def _gib(mib) -> str:
    return f"{mib / 1024:,.0f}"


def _host_facts(host: Host) -> dict:
    """Short texts for the stat tiles."""
    facts = {"memory": "", "memory_share": "", "ib": ""}
    if host.memory_used_mib is not None and host.memory_total_mib:
        facts["memory"] = f"{_gib(host.memory_used_mib)} / {_gib(host.memory_total_mib)} GiB"
        facts["memory_share"] = f"{100 * host.memory_used_mib / host.memory_total_mib:.0f} %"
    if host.ib_tx_bytes_per_s is not None or host.ib_rx_bytes_per_s is not None:
        gbit = [f"{v * 8 / 1e9:.2f}" if v is not None else "—" for v in (host.ib_tx_bytes_per_s, host.ib_rx_bytes_per_s)]
        facts["ib"] = " / ".join(gbit)
    return facts


def _ib_ports(host: Host) -> list[dict]:
    """Host.ib_ports as the latest report gave them (written by the ingest), rates formatted."""
    rows = []
    for port in host.ib_ports or ():
        if isinstance(port, dict):
            state = str(port.get("state") or "")
            rows.append({**port, "active": state.upper() == "ACTIVE",
                         "tx": _gbps(port.get("tx_bytes_per_s")), "rx": _gbps(port.get("rx_bytes_per_s"))})
    return rows


def index(request):
    state, pool, name, site = (request.GET.get(key, "").strip() for key in ("state", "pool", "name", "site"))
    pools = selectors.pool_rows()
    context = {
        "pools": pools,
        "round": selectors.latest_poll_round(),
        "states": Host.State.choices,
        "state": state,
        "pool": pool,
        "name": name,
        "site": site,
        "no_pool": selectors.NO_POOL,
        "busy_threshold": selectors.busy_threshold(),
        "state_classes": json.dumps({str(k): v for k, v in selectors.STATE_CLASSES.items()}),
        "hosts_total": sum(p["hosts"] for p in pools),
        "gpus_total": sum(p["gpus"] for p in pools),
    }
    error = None
    if state and state not in Host.State.values:
        error = f"Unknown host state {state!r}: choose one of {', '.join(Host.State.values)}."
    elif pool and pool != selectors.NO_POOL and not any(p["filter"] == pool for p in pools):
        known = ", ".join(p["name"] for p in pools if p["name"]) or "none defined yet"
        error = f"Unknown pool {pool!r}: pools are {known}."
    elif site and site != selectors.NO_POOL and not Site.objects.filter(name=site).exists():
        known = ", ".join(Site.objects.order_by("name").values_list("name", flat=True)[:20]) or "none defined yet"
        error = f"Unknown site {site!r}: sites are {known}."
    if error:
        # The page comes back with the message, not a 500 or a silently empty list.
        context["error"] = error
        return render(request, "pool/index.html", context, status=400)

    hosts = _at_site(selectors.host_list(state=state, pool=pool, name=name), site)
    context["counts"] = selectors.state_counts(_at_site(selectors.host_list(pool=pool, name=name), site))
    page = Paginator(hosts.order_by("name").values(*selectors.HOST_LIST_FIELDS), PAGE_SIZE).get_page(request.GET.get("page"))
    context.update(page=page, hosts=selectors.host_rows(page))
    return render(request, "pool/index.html", context)


def _at_site(hosts, site: str):
    """?site=: the overview's per-site GPU numbers link here (NO_POOL: hosts at no site)."""
    if not site:
        return hosts
    return hosts.filter(site__isnull=True) if site == selectors.NO_POOL else hosts.filter(site__name=site)


def host_detail(request, host):
    host = get_object_or_404(Host.objects.select_related("pool", "fabric", "site"), name=host)
    can_drain = request.user.has_perm(DRAIN_PERMISSION)
    if request.method == "POST":
        return _drain_action(request, host, can_drain)

    range_key = request.GET.get("range", selectors.DEFAULT_RANGE)
    chart = selectors.CHART_RANGES.get(range_key)
    gpus = selectors.host_gpus(host)
    context = {
        "host": host,
        "state_class": selectors.STATE_CLASSES.get(host.state, "state-unknown"),
        "can_drain": can_drain,
        "drained": host.state in Host.OPERATOR_STATES,
        "gpus": gpus,
        "present_gpus": sum(1 for g in gpus if g.present),
        "busy_gpus": sum(1 for g in gpus if g.busy),
        "gpus_updated_at": max((g.updated_at for g in gpus if g.present and g.updated_at), default=None),
        "busy_threshold": selectors.busy_threshold(),
        "adapters": selectors.host_adapters(host),
        "facts": _host_facts(host),
        "ib_ports": _ib_ports(host),
        "chart_panels": CHART_PANELS,
        "events": selectors.host_events(host),
        "ranges": selectors.CHART_RANGES.values(),
        "range": range_key,
        "no_pool": selectors.NO_POOL,
    }
    if chart is None:
        context["error"] = f"Unknown chart range {range_key!r}: choose one of {', '.join(selectors.CHART_RANGES)}."
        return render(request, "pool/host.html", context, status=400)
    data = selectors.chart_data(host, gpus, chart, timezone.now())
    for entry, gpu in zip(data["gpus"], gpus):
        entry["id"] = gpu.pk  # the key of the live updates (core.live_snapshots.gpu_values)
    data["busy_threshold"] = context["busy_threshold"]
    data["state_classes"] = {str(k): v for k, v in selectors.STATE_CLASSES.items()}
    context.update(chart=chart, chart_data=data)
    return render(request, "pool/host.html", context)


def _drain_action(request, host: Host, can_drain: bool):
    """POST action=drain|undrain (with an optional reason) from an operator or admin."""
    if not can_drain:
        # Checked here, not only by hiding the buttons: a viewer's hand-made POST changes nothing.
        return _refused(request, host, 403, "Only operators and admins may drain or undrain hosts. Nothing was changed.")
    action = request.POST.get("action", "")
    actor = request.user.get_username()
    if action == "drain":
        reason = " ".join(request.POST.get("reason", "").split())[:MAX_REASON]
        if drain_host(host, actor=actor, reason=reason):
            messages.success(request, f"{host.name} is draining: its running work goes on, its GPUs are offered to no one.")
        else:
            messages.info(request, f"{host.name} was already draining.")
    elif action == "undrain":
        if undrain_host(host, actor=actor):
            host.refresh_from_db(fields=["state"])
            messages.success(request, f"{host.name} is no longer drained; polling puts it at {host.state}.")
        else:
            messages.info(request, f"{host.name} was not drained (it is {host.state}); nothing changed.")
    else:
        return _refused(request, host, 400, f"Unknown action {action!r}: use drain or undrain. Nothing was changed.")
    return redirect("pool:host", host=host.name)



def _refused(request, host: Host, status: int, message: str):
    return render(request, "pool/refused.html", {"host": host, "message": message}, status=status)
