"""Read-side queries of the pool pages. Each returns plain rows built from a fixed number
of grouped queries, whatever the number of hosts, GPUs or samples, so that the host list
of a 4,096-host cluster renders as fast as a lab's."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Avg, Count, Q

from fabric.models import Link

from .models import Gpu, GpuRollup, GpuSample, Host, HostEvent, HostRollup, HostSample, PollRound, Pool, Resolution

# The scheduler's placements come later: until then a GPU counts as busy when its latest
# utilization reaches this share (an idle GPU reads 0-3 %).
DEFAULT_BUSY_UTILIZATION_PCT = 5.0
NO_POOL = "(none)"  # the pool filter value for hosts in no pool (not a valid pool slug)
RECENT_EVENTS = 25

# Every host state as a word with a colour class of fabricpool.css.
STATE_CLASSES = {
    Host.State.UP: "state-up",
    Host.State.STALE: "state-degraded",
    Host.State.DRAINING: "state-degraded",
    Host.State.UNREACHABLE: "state-down",
    Host.State.DOWN: "state-down",
    Host.State.NEW: "state-missing",
}


def busy_threshold() -> float:
    return float(getattr(settings, "POOL_BUSY_UTILIZATION_PCT", DEFAULT_BUSY_UTILIZATION_PCT))


def _busy_q(prefix: str = "") -> Q:
    return Q(**{f"{prefix}utilization__gte": busy_threshold()})


# --- the pool overview ---------------------------------------------------------------------


def pool_rows() -> list[dict]:
    """Every pool with its hosts, GPUs (present ones), busy GPUs, GPU models and sites;
    hosts in no pool as a last row when there are any. Four queries."""
    rows = {pk: {"name": name, "filter": name, "description": description, "hosts": 0, "gpus": 0, "busy": 0,
                 "models": [], "sites": []}
            for pk, name, description in Pool.objects.values_list("id", "name", "description")}
    rows[None] = {"name": "", "filter": NO_POOL, "description": "", "hosts": 0, "gpus": 0, "busy": 0, "models": [], "sites": []}
    for pool_id, n in Host.objects.values_list("pool_id").annotate(n=Count("id")).order_by():
        rows[pool_id]["hosts"] = n
    gpus = (Gpu.objects.filter(present=True).values("host__pool_id", "model")
            .annotate(n=Count("id"), busy=Count("id", filter=_busy_q())).order_by())
    for row in gpus:
        entry = rows[row["host__pool_id"]]
        entry["gpus"] += row["n"]
        entry["busy"] += row["busy"]
        if row["model"]:
            entry["models"].append((row["model"], row["n"]))
    for pool_id, site in Host.objects.filter(site__isnull=False).values_list("pool_id", "site__name").distinct().order_by():
        rows[pool_id]["sites"].append(site)
    for entry in rows.values():
        entry["models"].sort()
        entry["sites"].sort()
        entry["free"] = entry["gpus"] - entry["busy"]
    unpooled = rows.pop(None)
    return list(rows.values()) + ([unpooled] if unpooled["hosts"] else [])


def latest_poll_round() -> PollRound | None:
    return PollRound.objects.first()


def state_counts(hosts) -> dict[str, int]:
    counts = {state: 0 for state in Host.State.values}
    for state, n in hosts.values_list("state").annotate(n=Count("id")).order_by():
        counts[state] = n
    return counts


# --- the host list -------------------------------------------------------------------------

HOST_LIST_FIELDS = ("id", "name", "state", "agent_kind", "pool__name", "fabric__name", "last_report_at", "last_error",
                    "last_error_at", "in_fabric")


def host_list(*, state: str = "", pool: str = "", name: str = ""):
    """Hosts as value rows for the list, filtered; values of the filters are checked by the caller."""
    hosts = Host.objects.all()
    if state:
        hosts = hosts.filter(state=state)
    if pool == NO_POOL:
        hosts = hosts.filter(pool__isnull=True)
    elif pool:
        hosts = hosts.filter(pool__name=pool)
    if name:
        hosts = hosts.filter(name__icontains=name)
    return hosts


def host_rows(page_rows) -> list[dict]:
    """One page of host_list().values(*HOST_LIST_FIELDS) with GPU numbers: present GPUs,
    busy, free and average utilization (one grouped query for the page)."""
    rows = [dict(row) for row in page_rows]
    stats = {
        row["host_id"]: row for row in Gpu.objects.filter(host_id__in=[r["id"] for r in rows], present=True)
        .values("host_id").annotate(total=Count("id"), busy=Count("id", filter=_busy_q()), avg=Avg("utilization")).order_by()
    }
    for row in rows:
        gpu = stats.get(row["id"], {"total": 0, "busy": 0, "avg": None})
        row["gpus"], row["busy"], row["avg_utilization"] = gpu["total"], gpu["busy"], gpu["avg"]
        row["free"] = gpu["total"] - gpu["busy"]
        row["offers_gpus"] = row["agent_kind"] == Host.AgentKind.FABRICPOOL and row["state"] == Host.State.UP
        row["state_class"] = STATE_CLASSES.get(row["state"], "state-unknown")
    return rows


# --- one host ------------------------------------------------------------------------------


def host_adapters(host: Host) -> list[dict]:
    """The host's adapters, each with the switch port its cable ends on (two queries)."""
    adapters = {
        row["id"]: {**row, "links": []}
        for row in host.adapters.order_by("description", "guid").values("id", "guid", "description", "present", "fabric__name")
    }
    links = Link.objects.filter(Q(port_a__adapter_id__in=adapters) | Q(port_b__adapter_id__in=adapters)).values(
        "state", "gbps", "width", "speed",
        *[f"port_{s}__{f}" for s in "ab" for f in ("adapter_id", "number", "lid", "switch__guid", "switch__description", "switch__tier")])
    for link in links:
        for near, far in (("a", "b"), ("b", "a")):
            adapter_id = link[f"port_{near}__adapter_id"]
            if adapter_id in adapters:
                adapters[adapter_id]["links"].append({
                    "state": link["state"], "gbps": link["gbps"], "width": link["width"], "speed": link["speed"],
                    "port": link[f"port_{near}__number"], "lid": link[f"port_{near}__lid"],
                    "switch_guid": link[f"port_{far}__switch__guid"], "switch": link[f"port_{far}__switch__description"],
                    "switch_tier": link[f"port_{far}__switch__tier"], "switch_port": link[f"port_{far}__number"],
                })
    return list(adapters.values())


def host_gpus(host: Host) -> list[Gpu]:
    threshold = busy_threshold()
    gpus = list(Gpu.objects.filter(host=host).order_by("-present", "index"))
    for gpu in gpus:
        gpu.busy = gpu.present and gpu.utilization is not None and gpu.utilization >= threshold
    return gpus


def host_events(host: Host, limit: int = RECENT_EVENTS) -> list[HostEvent]:
    return list(HostEvent.objects.filter(host=host)[:limit])


# --- charts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChartRange:
    key: str
    label: str
    span: timedelta
    # (source, max age): the first source covers the whole span; each finer one continues
    # where the coarser one's newest bucket ends, so the chart reaches now although rollups
    # run only every few minutes. The max age bounds a finer source when rollups lag.
    sources: tuple
    resolution_text: str


RAW = "samples"
CHART_RANGES = {
    "1h": ChartRange("1h", "last hour", timedelta(hours=1), ((RAW, timedelta(hours=1)),), "every poll"),
    "24h": ChartRange("24h", "last 24 hours", timedelta(hours=24),
                      ((Resolution.MINUTE, timedelta(hours=24)), (RAW, timedelta(minutes=15))), "1-minute averages"),
    "7d": ChartRange("7d", "last 7 days", timedelta(days=7),
                     ((Resolution.HOUR, timedelta(days=7)), (Resolution.MINUTE, timedelta(hours=3)), (RAW, timedelta(minutes=15))),
                     "1-hour averages"),
}
DEFAULT_RANGE = "1h"

GPU_METRICS = ("utilization", "memory_used_mib", "temperature_c", "power_w")
HOST_METRICS = ("cpu_percent", "memory_used_mib", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s")


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _num(value):
    return None if value is None else round(value, 2)


def _series(sample_model, rollup_model, owner: str, owner_ids: list[int], metrics, chart: ChartRange, now: datetime) -> dict:
    """{owner id: {"t": [epoch ms], metric: [values]}} over the range, coarse sources first."""
    series = {pk: {"t": [], **{m: [] for m in metrics}} for pk in owner_ids}
    if not owner_ids:
        return series
    covered_until = None  # end of the newest bucket read so far
    for source, max_age in chart.sources:
        since = now - max_age
        if covered_until is not None:
            since = max(since, covered_until)
        if source == RAW:
            rows = sample_model.objects.filter(**{f"{owner}__in": owner_ids}, t__gte=since).values_list(owner, "t", *metrics)
        else:
            rows = rollup_model.objects.filter(**{f"{owner}__in": owner_ids}, resolution=source, t__gte=since).values_list(
                owner, "t", *[f"{m}_avg" for m in metrics])
        newest = None
        for pk, t, *values in rows.order_by(owner, "t"):
            entry = series[pk]
            entry["t"].append(_ms(t))
            for metric, value in zip(metrics, values):
                entry[metric].append(_num(value))
            newest = t if newest is None or t > newest else newest
        if newest is not None and source != RAW:
            covered_until = newest + timedelta(seconds=int(source))
    return series


def chart_data(host: Host, gpus: list[Gpu], chart: ChartRange, now: datetime) -> dict:
    """What static/js/pool-charts.js draws, for json_script. Texts stay plain here; the page
    script escapes them before plotly sees them."""
    gpu_series = _series(GpuSample, GpuRollup, "gpu_id", [g.pk for g in gpus], GPU_METRICS, chart, now)
    host_series = _series(HostSample, HostRollup, "host_id", [host.pk], HOST_METRICS, chart, now)[host.pk]
    return {
        "range": chart.key,
        "resolution": chart.resolution_text,
        "start": _ms(now - chart.span),
        "end": _ms(now),
        "host": {"name": host.name, **host_series},
        "gpus": [{"label": f"gpu{g.index}", "model": g.model, "uuid": g.uuid, **gpu_series[g.pk]} for g in gpus],
    }
