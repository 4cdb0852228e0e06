"""The full state of each live view, sent to a client first (and on resync); deltas of
core.live then change it in place. The same functions give the values the publishers
compare against, so a delta and a snapshot can never disagree on a value's shape.

Compact by design: the pool view is column arrays (one entry per GPU), not objects.
"""
from __future__ import annotations

from django.db.models import Count

from fabric.models import Link
from pool.models import Gpu, Host
from pool.selectors import pool_rows
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu
from scheduler.selectors import ACTIVE_JOB_STATES, QUEUED_STATES


def _ms(dt):
    return int(dt.timestamp() * 1000) if dt else None


def _num(value, digits=1):
    return None if value is None else round(float(value), digits)


# --- overview ------------------------------------------------------------------------------

def overview() -> dict:
    """Flat {key: value} (a delta replaces whole keys): GPUs per pool, hosts per state, jobs
    per state, the latest cycle, links not up."""
    hosts = {state: 0 for state in Host.State.values}
    for state, n in Host.objects.values_list("state").annotate(n=Count("id")).order_by():
        hosts[state] = n
    jobs = {state: 0 for state in ACTIVE_JOB_STATES}
    for state, n in Job.objects.filter(state__in=ACTIVE_JOB_STATES).values_list("state").annotate(n=Count("id")).order_by():
        jobs[state] = n
    allocated = PlacementGpu.objects.filter(active=True).count()
    links = {state: 0 for state in (Link.State.DEGRADED, Link.State.DOWN, Link.State.MISSING)}
    for state, n in Link.objects.filter(state__in=list(links)).values_list("state").annotate(n=Count("id")).order_by():
        links[state] = n
    cycle = AllocationCycle.objects.first()
    return {
        "pools": [{"name": p["name"], "gpus": p["gpus"], "busy": p["busy"], "free": p["free"]} for p in pool_rows()],
        "gpus_allocated": allocated,
        "hosts": hosts,
        "jobs": jobs,
        "pending_reasons": cycle.pending_reasons if cycle else {},
        "last_cycle": None if cycle is None else {
            "id": cycle.pk, "at": _ms(cycle.started_at), "duration_s": _num(cycle.duration_s, 3),
            "error": cycle.error[:200]},
        "links": {str(k): v for k, v in links.items()},
    }


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

def gpu_values(host_ids=None) -> dict[str, list]:
    """{gpu id: [utilization %, memory used MiB, temperature °C]} of present GPUs."""
    rows = Gpu.objects.filter(present=True)
    if host_ids is not None:
        rows = rows.filter(host_id__in=host_ids)
    return {str(pk): [_num(u), m, _num(t)]
            for pk, u, m, t in rows.values_list("id", "utilization", "memory_used_mib", "temperature_c")}


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
