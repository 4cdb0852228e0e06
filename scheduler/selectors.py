"""Read-side queries of the scheduler pages. Each list is built from a fixed number of
queries whatever the number of jobs, placements or GPUs: related rows come in one grouped
query per page, never one per row."""
from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Q
from django.utils import timezone

from fabric.models import Link
from pool.models import Gpu, Host, Pool

from . import engine, snapshot
from .engine import REASONS
from .models import AllocationCycle, AuditEvent, Job, Placement, PlacementGpu, Tenant

RECENT_CYCLES = 10
# Why a job waits, as a few words for tables and headings (the sentence is on the job).
REASON_LABELS = {
    "resources": "not enough free GPUs",
    "priority": "higher-priority jobs first",
    "quota": "tenant quota",
    "topology_wait": "waiting for fewer leaf switches",
    "constraints": "constraints cannot be met",
    "unhealthy_hosts": "only unhealthy hosts fit",
    "reserved_for_higher_priority": "GPUs reserved for a higher-priority job",
    "rejected": "proposal rejected",
    "expired": "proposal expired",
    "dispatch_failed": "dispatch failed",
    "new": "not looked at by a cycle yet",
}
assert set(REASONS) <= set(REASON_LABELS)

# Every state as a word with a colour class of fabricpool.css.
JOB_STATE_CLASSES = {
    Job.State.PENDING: "state-missing",
    Job.State.PROPOSED: "state-degraded",
    Job.State.APPROVED: "state-up",
    Job.State.DISPATCHING: "state-up",
    Job.State.RUNNING: "state-up",
    Job.State.SUCCEEDED: "state-up",
    Job.State.FAILED: "state-down",
    Job.State.CANCELLED: "state-missing",
    Job.State.PREEMPTED: "state-degraded",
}
PLACEMENT_STATE_CLASSES = {
    Placement.State.PROPOSED: "state-degraded",
    Placement.State.APPROVED: "state-up",
    Placement.State.DISPATCHING: "state-up",
    Placement.State.RUNNING: "state-up",
    Placement.State.FINISHED: "state-up",
    Placement.State.REJECTED: "state-down",
    Placement.State.FAILED: "state-down",
    Placement.State.EXPIRED: "state-missing",
    Placement.State.CANCELLED: "state-missing",
}
# The states the dashboard's queue, proposal and running sections show.
ACTIVE_JOB_STATES = (Job.State.PENDING, Job.State.PREEMPTED, Job.State.PROPOSED, Job.State.APPROVED,
                     Job.State.DISPATCHING, Job.State.RUNNING)
QUEUED_STATES = (Job.State.PENDING, Job.State.PREEMPTED)  # what the engine queues
RUNNING_PLACEMENT_STATES = (Placement.State.APPROVED, Placement.State.DISPATCHING, Placement.State.RUNNING)
JOB_LIST_FIELDS = ("id", "name", "tenant__name", "pool__name", "gpus", "priority", "state", "state_changed_at",
                   "created_at", "started_at", "finished_at", "pending_reason", "pending_message", "expected_start", "exit_code", "message")


def reason_label(code: str) -> str:
    return REASON_LABELS.get(code, code.replace("_", " ") if code else "")


def filter_choices() -> dict:
    """Tenant and pool names for the filter menus (two small queries)."""
    return {"tenants": list(Tenant.objects.values_list("name", flat=True)),
            "pools": list(Pool.objects.values_list("name", flat=True))}


def filter_error(*, tenant: str, pool: str, state: str, choices: dict, states) -> str | None:
    """A sentence naming the bad filter value, or None when all are known."""
    if tenant and tenant not in choices["tenants"]:
        known = ", ".join(choices["tenants"]) or "none defined yet"
        return f"Unknown tenant {tenant!r}: tenants are {known}."
    if pool and pool not in choices["pools"]:
        known = ", ".join(choices["pools"]) or "none defined yet"
        return f"Unknown pool {pool!r}: pools are {known}."
    if state and state not in states:
        return f"Unknown state {state!r}: choose one of {', '.join(states)}."
    return None


def _job_filter(prefix: str, *, tenant: str = "", pool: str = "") -> Q:
    q = Q()
    if tenant:
        q &= Q(**{f"{prefix}tenant__name": tenant})
    if pool:
        q &= Q(**{f"{prefix}pool__name": pool})
    return q


# --- the scheduler page --------------------------------------------------------------------


def queue(*, tenant: str = "", pool: str = "", states=QUEUED_STATES):
    """Queued jobs, roughly in the order the engine considers them (priority, then age;
    fair share comes between them there); rows of JOB_LIST_FIELDS."""
    return (Job.objects.filter(_job_filter("", tenant=tenant, pool=pool), state__in=states)
            .order_by("-priority", "created_at", "id").values(*JOB_LIST_FIELDS))


def job_rows(rows) -> list[dict]:
    """Job rows (values of JOB_LIST_FIELDS) with their state class and reason label."""
    out = []
    for row in rows:
        row = dict(row)
        row["state_class"] = JOB_STATE_CLASSES.get(row["state"], "state-unknown")
        row["reason_label"] = reason_label(row["pending_reason"])
        out.append(row)
    return out


def placements(*, states, tenant: str = "", pool: str = "", order=("-created_at", "-id")):
    return (Placement.objects.filter(_job_filter("job__", tenant=tenant, pool=pool), state__in=states)
            .select_related("job", "job__tenant", "job__pool").order_by(*order))


def placement_rows(page_rows) -> list[dict]:
    """Placements of one page with their GPU count and host names: one query for all."""
    items = list(page_rows)
    hosts: dict[int, list[str]] = defaultdict(list)
    gpus: dict[int, int] = defaultdict(int)
    pairs = (PlacementGpu.objects.filter(placement__in=[p.pk for p in items])
             .values_list("placement_id", "gpu__host__name").annotate(n=Count("id")).order_by("gpu__host__name"))
    for placement_id, host_name, n in pairs:
        hosts[placement_id].append(host_name)
        gpus[placement_id] += n
    return [{"placement": p, "job": p.job, "gpus": gpus[p.pk], "hosts": hosts[p.pk],
             "state_class": PLACEMENT_STATE_CLASSES.get(p.state, "state-unknown"),
             "extra_leaves": (p.leaves - p.lower_bound_leaves) if p.lower_bound_leaves is not None else None}
            for p in items]


def recent_cycles(limit: int = RECENT_CYCLES):
    return AllocationCycle.objects.all()[:limit]


def cycle_rows(cycles) -> list[dict]:
    return [{"cycle": c, "reasons": reasons_list(c.pending_reasons)} for c in cycles]


def reasons_list(pending_reasons: dict) -> list[dict]:
    """A cycle's {reason code: count} as rows, the largest first."""
    items = sorted((pending_reasons or {}).items(), key=lambda kv: (-int(kv[1] or 0), kv[0]))
    return [{"code": code, "label": reason_label(code), "count": n} for code, n in items]


def headline(*, tenant: str = "", pool: str = "") -> dict:
    """Counts of the stat tiles: jobs per active state (one grouped query) and the latest
    cycle's GPU counts."""
    counts = {state: 0 for state in ACTIVE_JOB_STATES}
    rows = (Job.objects.filter(_job_filter("", tenant=tenant, pool=pool), state__in=ACTIVE_JOB_STATES)
            .values_list("state").annotate(n=Count("id")).order_by())
    for state, n in rows:
        counts[state] = n
    return {"counts": counts, "cycle": AllocationCycle.objects.first()}


# --- the fabric around GPUs ------------------------------------------------------------------


def host_leaves(host_ids) -> dict[int, list[dict]]:
    """{host id: [{"id", "name"}...]} the switches each host's adapters are cabled to (its
    leaf switches; one per rail on a rail-optimized fabric). Two queries."""
    found: dict[int, dict[int, str]] = defaultdict(dict)
    host_ids = list(host_ids)
    for near, far in (("port_a", "port_b"), ("port_b", "port_a")):
        rows = (Link.objects.filter(**{f"{near}__adapter__hosts__in": host_ids, f"{far}__switch__isnull": False})
                .values_list(f"{near}__adapter__hosts", f"{far}__switch_id", f"{far}__switch__description")
                .distinct())
        for host_id, switch_id, name in rows:
            found[host_id][switch_id] = name or f"switch {switch_id}"
    return {h: [{"id": s, "name": n} for s, n in sorted(leaves.items(), key=lambda kv: kv[1])]
            for h, leaves in found.items()}


def _leaf_key(leaves: list[dict]) -> tuple:
    return tuple(leaf["id"] for leaf in leaves)


def _leaf_name(leaves: list[dict]) -> str:
    return " + ".join(leaf["name"] for leaf in leaves) or "no leaf switch known"


def group_gpus(gpus: list[dict], leaves_of: dict[int, list[dict]]) -> list[dict]:
    """GPU rows (with host_id, host__name, index) grouped by leaf, then host:
    [{"leaf": name, "hosts": [{"name", "gpus": [...]}]}], leaves and hosts by name."""
    by_leaf: dict[tuple, dict] = {}
    for gpu in sorted(gpus, key=lambda g: (g["host__name"], g["index"])):
        leaves = leaves_of.get(gpu["host_id"], [])
        group = by_leaf.setdefault(_leaf_key(leaves), {"leaf": _leaf_name(leaves), "hosts": {}})
        host = group["hosts"].setdefault(gpu["host_id"], {"name": gpu["host__name"], "id": gpu["host_id"], "gpus": []})
        host["gpus"].append(gpu)
    groups = sorted(by_leaf.values(), key=lambda g: g["leaf"])
    for group in groups:
        group["hosts"] = list(group["hosts"].values())
        group["gpus"] = sum(len(h["gpus"]) for h in group["hosts"])
    return groups


GPU_FIELDS = ("id", "index", "model", "memory_mib", "fp64_class", "present", "host_id", "host__name")


def gpus_by_id(gpu_ids) -> list[dict]:
    return list(Gpu.objects.filter(pk__in=list(gpu_ids)).values(*GPU_FIELDS))


def placement_gpu_groups(gpu_ids) -> list[dict]:
    """The GPUs of a placement (ids) grouped by leaf and host. Three queries."""
    gpus = gpus_by_id(gpu_ids)
    return group_gpus(gpus, host_leaves({g["host_id"] for g in gpus}))


def pool_gpu_choices(placement: Placement) -> list[dict]:
    """Every GPU of the placement's pool for the override form, grouped by leaf and host,
    each marked free, busy (in another active placement, with its job) or unavailable (the
    host offers nothing now), and chosen when in this placement. Four queries."""
    pool_id = placement.job.pool_id
    gpus = list(Gpu.objects.filter(host__pool_id=pool_id).values(*GPU_FIELDS, "host__state", "host__agent_kind",
                                                                 "foreign_busy_until"))
    now = timezone.now()
    ids = [g["id"] for g in gpus]
    taken = {gpu_id: (placement_id, job_id) for gpu_id, placement_id, job_id in
             PlacementGpu.objects.filter(gpu_id__in=ids, active=True)
             .values_list("gpu_id", "placement_id", "placement__job_id")}
    own = set(placement.placement_gpus.values_list("gpu_id", flat=True))
    for gpu in gpus:
        holder = taken.get(gpu["id"])
        offers = gpu["host__state"] == Host.State.UP and gpu["host__agent_kind"] == Host.AgentKind.FABRICPOOL
        gpu["chosen"] = gpu["id"] in own
        if holder and holder[0] != placement.pk:
            gpu["status"], gpu["job_id"] = "busy", holder[1]
        elif not gpu["present"] or not offers:
            gpu["status"] = "unavailable"
        elif gpu["foreign_busy_until"] is not None and gpu["foreign_busy_until"] > now:
            gpu["status"] = "used by work the scheduler does not know"  # scheduler.reconcile saw it
        else:
            gpu["status"] = "free"
        gpu["status_class"] = {"free": "state-up", "busy": "state-degraded"}.get(gpu["status"], "state-missing")
    return group_gpus(gpus, host_leaves({g["host_id"] for g in gpus}))


# --- history -----------------------------------------------------------------------------


def job_list(*, tenant: str = "", pool: str = "", state: str = "", name: str = "", reason: str = ""):
    jobs = Job.objects.filter(_job_filter("", tenant=tenant, pool=pool))
    if state:
        jobs = jobs.filter(state=state)
    if reason:
        jobs = jobs.filter(pending_reason=reason)
    if name:
        jobs = jobs.filter(name__icontains=name)
    return jobs.order_by("-created_at", "-id").values(*JOB_LIST_FIELDS)


def audit_events(**where):
    return AuditEvent.objects.filter(**where).select_related("placement").order_by("created_at", "id")


def job_placements(job: Job) -> list[dict]:
    return placement_rows(job.placements.select_related("job", "job__tenant", "job__pool").order_by("-created_at", "-id"))


# --- costs -----------------------------------------------------------------------------------

COST_PARTS = [
    ("hosts", "hosts"),
    ("leaves", "leaf switches"),
    ("pod_crossings", "pod crossings (through the core)"),
    ("health_penalty", "health penalty (0: all uplinks up, 1: cut off)"),
    ("fragmentation_left", "GPUs left free on its hosts (fragmentation)"),
]


def cost_table(columns: list[tuple[str, dict]]) -> dict:
    """Costs side by side, in the engine's order of importance: {"heads": [labels],
    "rows": [{"label", "values", "differs"}]}. Missing parts show as None."""
    rows = []
    for key, label in COST_PARTS:
        values = [(cost or {}).get(key) for _, cost in columns]
        rows.append({"key": key, "label": label, "values": values, "differs": len(set(map(str, values))) > 1})
    return {"heads": [head for head, _ in columns], "rows": rows}


def preview_override(placement: Placement, gpu_ids) -> engine.Cost | list[str]:
    """What overriding `placement` with `gpu_ids` would cost now, or the rules the pick
    breaks (sentences): the same checks services.override makes, without writing."""
    held = (PlacementGpu.objects.filter(active=True, gpu_id__in=list(gpu_ids)).exclude(placement=placement)
            .select_related("gpu__host", "placement").order_by("gpu_id"))
    problems = [f"{row.gpu} is held by job {row.placement.job_id} ({row.placement.state})." for row in held]
    taken = snapshot.take(timezone.now(), with_queue=False).snapshot
    outcome = engine.validate_and_cost(snapshot.job_for_engine(placement.job), list(gpu_ids), taken)
    if isinstance(outcome, list):
        # The engine names busy GPUs too; keep each sentence once.
        return list(dict.fromkeys(problems + outcome))
    return problems or outcome
