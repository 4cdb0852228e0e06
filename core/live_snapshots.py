"""The full state of each live view, sent to a client first (and on resync); deltas of
core.live then change it in place. The same functions give the values the publishers
compare against, so a delta and a snapshot can never disagree on a value's shape.

Compact by design: the pool view is column arrays (one entry per GPU), not objects.
"""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Avg, Count, Exists, Max, OuterRef, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from fabric.models import Fabric, Link
from pool.models import Gpu, GpuSample, Host
from pool.selectors import NO_POOL, busy_threshold
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu
from scheduler.selectors import ACTIVE_JOB_STATES, QUEUED_STATES


def _ms(dt):
    return int(dt.timestamp() * 1000) if dt else None


def _num(value, digits=1):
    return None if value is None else round(float(value), digits)


# --- overview ------------------------------------------------------------------------------

def overview() -> dict:
    """Flat {key: value} (a delta replaces whole keys): GPUs per pool and per site, hosts per
    state, jobs per state, the latest cycle, links not up (in all and per fabric), the cluster's
    mean GPU utilization. Eight queries."""
    hosts = {state: 0 for state in Host.State.values}
    for state, n in Host.objects.values_list("state").annotate(n=Count("id")).order_by():
        hosts[state] = n
    jobs = {state: 0 for state in ACTIVE_JOB_STATES}
    for state, n in Job.objects.filter(state__in=ACTIVE_JOB_STATES).values_list("state").annotate(n=Count("id")).order_by():
        jobs[state] = n
    split = gpu_split()
    per_fabric = fabric_links()
    links = {str(state): sum(f[str(state)] for f in per_fabric.values()) for state in LINK_PROBLEMS}
    cycle = AllocationCycle.objects.first()
    return {
        "gpus_allocated": sum(p["allocated"] for p in split["gpu_pools"]),
        "hosts": hosts,
        "jobs": jobs,
        "pending_reasons": cycle.pending_reasons if cycle else {},
        "last_cycle": None if cycle is None else {
            "id": cycle.pk, "at": _ms(cycle.started_at), "duration_s": _num(cycle.duration_s, 3),
            "error": cycle.error[:200]},
        "links": links,
        **split,
        "fabric_links": per_fabric,
    }


def gpu_split() -> dict:
    """Present GPUs per pool and per site: total, allocated (held by an active placement),
    idle but allocated (held while under the busy threshold or without a reading) and free
    (held by no placement). `filter` is the value of the pool list's pool/site filter. Also the
    cluster's mean utilization. One query."""
    threshold = busy_threshold()
    held = Q(held=True)
    idle = held & (Q(utilization__lt=threshold) | Q(utilization__isnull=True))
    rows = (Gpu.objects.filter(present=True)
            .annotate(held=Exists(PlacementGpu.objects.filter(gpu=OuterRef("pk"), active=True)))
            .values_list("host__pool__name", "host__site__name")
            .annotate(total=Count("id"), allocated=Count("id", filter=held), idle=Count("id", filter=idle),
                      util_sum=Sum("utilization"), util_n=Count("utilization"), t=Max("updated_at"))
            .order_by())
    pools: dict = {}
    sites: dict = {}
    util_sum, util_n, latest = 0.0, 0, None
    for pool_name, site_name, total, allocated, idle_n, u_sum, u_n, t in rows:
        util_sum, util_n = util_sum + (u_sum or 0), util_n + u_n
        latest = t if latest is None or (t is not None and t > latest) else latest
        for table, name, empty in ((pools, pool_name, NO_POOL), (sites, site_name, NO_POOL)):
            entry = table.setdefault(name or "", {"name": name or "", "filter": name or empty,
                                                  "total": 0, "allocated": 0, "idle_allocated": 0, "free": 0})
            entry["total"] += total
            entry["allocated"] += allocated
            entry["idle_allocated"] += idle_n
            entry["free"] += total - allocated
    # Named ones first by name; "no pool" / "no site" last.
    order = lambda e: (e["name"] == "", e["name"])  # noqa: E731
    # The cluster's mean utilization (GPUs with a reading) and its latest reading's time
    # (epoch ms): a point of the overview's utilization chart.
    utilization = {"t": _ms(latest), "mean": _num(util_sum / util_n) if util_n else None, "gpus": util_n}
    return {"gpu_pools": sorted(pools.values(), key=order), "gpu_sites": sorted(sites.values(), key=order),
            "utilization": utilization}


LINK_PROBLEMS = (Link.State.DEGRADED, Link.State.DOWN, Link.State.MISSING)


def fabric_links() -> dict:
    """{fabric name: {state: links}} of links not up, every fabric with every such state. One query."""
    counts = {str(s): Count("links", filter=Q(links__state=s)) for s in LINK_PROBLEMS}
    return {row.pop("name"): row for row in Fabric.objects.values("name").annotate(**counts).order_by()}


def utilization_history(minutes: int = 60, now=None) -> dict:
    """Mean GPU utilization of the whole cluster per minute over the last `minutes`, from the
    samples (epoch ms at the start of each minute). One grouped query on the samples' time index."""
    now = now or timezone.now()
    rows = (GpuSample.objects.filter(t__gte=now - timedelta(minutes=minutes), utilization__isnull=False)
            .annotate(m=TruncMinute("t")).values("m").annotate(u=Avg("utilization")).order_by("m"))
    rows = [r for r in rows if r["m"] is not None]
    return {"t": [_ms(r["m"]) for r in rows], "mean": [_num(r["u"]) for r in rows],
            "start": _ms(now - timedelta(minutes=minutes)), "end": _ms(now)}


# --- queue and proposals -------------------------------------------------------------------

def job_row(job: dict) -> dict:
    return {"id": job["id"], "name": job["name"], "tenant": job["tenant__name"], "pool": job["pool__name"],
            "gpus": job["gpus"], "priority": job["priority"], "state": job["state"],
            "reason": job["pending_reason"], "expected_start": _ms(job["expected_start"])}


JOB_FIELDS = ("id", "name", "tenant__name", "pool__name", "gpus", "priority", "state", "pending_reason",
              "expected_start")


def jobs(job_ids=None) -> dict[str, dict]:
    """Queued jobs by id ("pending" or "preempted")."""
    rows = Job.objects.filter(state__in=QUEUED_STATES)
    if job_ids is not None:
        rows = rows.filter(pk__in=job_ids)
    return {str(r["id"]): job_row(r) for r in rows.order_by("-priority", "created_at", "id").values(*JOB_FIELDS)}


def proposals(job_ids=None) -> dict[str, dict]:
    """Proposals waiting for a decision by placement id, with the version a decision names."""
    rows = Placement.objects.filter(state=Placement.State.PROPOSED).select_related("job", "job__tenant")
    if job_ids is not None:
        rows = rows.filter(job_id__in=job_ids)
    counts = dict(PlacementGpu.objects.filter(placement__in=rows).values_list("placement_id")
                  .annotate(n=Count("id")).order_by())
    return {str(p.pk): {"id": p.pk, "job": p.job_id, "job_name": p.job.name, "tenant": p.job.tenant.name,
                        "version": p.version, "gpus": counts.get(p.pk, 0), "hosts": p.hosts, "leaves": p.leaves,
                        "is_override": p.is_override, "expires_at": _ms(p.expires_at)}
            for p in rows.order_by("created_at", "id")}


def queue() -> dict:
    return {"jobs": jobs(), "proposals": proposals()}


# --- pool: hosts x GPUs --------------------------------------------------------------------

def gpu_values(host_ids=None, host_of: dict | None = None) -> dict[str, list]:
    """{gpu id: [utilization %, memory used MiB, temperature °C]} of present GPUs; fills
    `host_of` {gpu id: host id} from the same query when given."""
    rows = Gpu.objects.filter(present=True)
    if host_ids is not None:
        rows = rows.filter(host_id__in=host_ids)
    values = {}
    for pk, host_id, u, m, t in rows.values_list("id", "host_id", "utilization", "memory_used_mib", "temperature_c"):
        values[str(pk)] = [_num(u), m, _num(t)]
        if host_of is not None:
            host_of[str(pk)] = host_id
    return values


def allocations(gpu_ids=None) -> dict[str, int]:
    """{gpu id: job id} of GPUs held by an active placement."""
    rows = PlacementGpu.objects.filter(active=True)
    if gpu_ids is not None:
        rows = rows.filter(gpu_id__in=gpu_ids)
    return {str(g): j for g, j in rows.values_list("gpu_id", "placement__job_id")}


def host_states() -> dict[str, str]:
    return {str(pk): state for pk, state in Host.objects.values_list("id", "state")}


def pool() -> dict:
    """Hosts as arrays (id, name, state) and GPUs as arrays indexed alike (host position,
    index, memory total, utilization, memory used, temperature, job holding it or 0)."""
    hosts = list(Host.objects.order_by("name").values_list("id", "name", "state"))
    position = {h[0]: i for i, h in enumerate(hosts)}
    gpus = list(Gpu.objects.filter(present=True).order_by("host__name", "index")
                .values_list("id", "host_id", "index", "memory_mib", "utilization", "memory_used_mib", "temperature_c"))
    held = allocations()
    return {
        "hosts": {"id": [h[0] for h in hosts], "name": [h[1] for h in hosts], "state": [h[2] for h in hosts]},
        "gpus": {
            "id": [g[0] for g in gpus], "host": [position[g[1]] for g in gpus], "index": [g[2] for g in gpus],
            "memory_mib": [g[3] for g in gpus], "util": [_num(g[4]) for g in gpus], "mem": [g[5] for g in gpus],
            "temp": [_num(g[6]) for g in gpus], "job": [held.get(str(g[0]), 0) for g in gpus],
        },
    }


# --- one host ------------------------------------------------------------------------------

def host(host_id: int) -> dict:
    h = Host.objects.get(pk=host_id)
    gpus = list(Gpu.objects.filter(host=h, present=True).order_by("index")
                .values_list("id", "index", "model", "memory_mib", "utilization", "memory_used_mib", "temperature_c"))
    held = allocations([g[0] for g in gpus])
    return {
        "host": {"id": h.pk, "name": h.name, "state": h.state, "last_report_at": _ms(h.last_report_at),
                 "cpu_percent": _num(h.cpu_percent), "memory_used_mib": _num(h.memory_used_mib, 0),
                 "last_error": h.last_error[:200]},
        "gpus": [{"id": g[0], "index": g[1], "model": g[2], "memory_mib": g[3], "util": _num(g[4]), "mem": g[5],
                  "temp": _num(g[6]), "job": held.get(str(g[0]), 0)} for g in gpus],
    }


# --- topology: host colours and link health ----------------------------------------------------

def topology_hosts(host_ids=None) -> dict[str, list]:
    """{host id: [state, mean GPU utilization, busy GPUs, tenant]}: what colours a host on the
    topology page (core.topology computes the same values for the page's first drawing).
    Three queries."""
    threshold = busy_threshold()
    hosts = Host.objects.all()
    gpus = Gpu.objects.filter(present=True)
    held = PlacementGpu.objects.filter(active=True, placement__state__in=Placement.ACTIVE_STATES)
    if host_ids is not None:
        host_ids = list(host_ids)
        hosts, gpus, held = (hosts.filter(pk__in=host_ids), gpus.filter(host_id__in=host_ids),
                             held.filter(gpu__host_id__in=host_ids))
    load = {h: (u, busy) for h, u, busy in gpus.values_list("host_id").annotate(
        u=Avg("utilization"), busy=Count("id", filter=Q(utilization__gte=threshold))).order_by()}
    tenants: dict[int, list[str]] = {}
    for host_id, tenant in held.values_list("gpu__host_id", "placement__job__tenant__name"):
        tenants.setdefault(host_id, []).append(tenant)
    out = {}
    for pk, state in hosts.values_list("id", "state"):
        u, busy = load.get(pk, (None, 0))
        names = tenants.get(pk)
        # The tenant holding most of the host's GPUs; ties go to the first name (as core.topology).
        tenant = max(sorted(set(names)), key=names.count) if names else None
        out[str(pk)] = [state, _num(u), busy, tenant]
    return out


def topology_links() -> dict[str, str]:
    """{link id: state} of the links the topology page draws (switch and host cables)."""
    rows = Link.objects.filter(kind__in=[Link.Kind.SWITCH_SWITCH, Link.Kind.ADAPTER_SWITCH]).values_list("id", "state")
    return {str(pk): state for pk, state in rows}


def topology() -> dict:
    return {"hosts": topology_hosts(), "links": topology_links()}
