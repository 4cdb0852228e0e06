"""FabricPool's own metrics for Prometheus, read from the database at scrape time.

Every process (daphne, workers, beat) sees the same numbers because nothing is counted in
memory: a scrape runs a fixed number of grouped queries (about fifteen, whatever the
cluster size) and turns the rows into metric families.

Labels are bounded: pool, tenant and fabric names (a few per cluster) and fixed vocabularies
(states, reasons). Never a host, GPU or job name.

The two duration histograms (allocation cycles, poll rounds) are built from the rows of the
last METRICS_WINDOW_S seconds (15 minutes by default): their buckets, _sum and _count describe
that window, not the life of the process, so they can go down. Take quantiles straight from
the buckets, `histogram_quantile(0.95, sum by (le) (fabricpool_allocation_cycle_duration_seconds_bucket))`,
not through rate().
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Avg, Case, CharField, Count, Exists, Max, Min, OuterRef, Q, Sum, Value, When
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from fabric.models import Fabric, Link
from pool.models import Gpu, Host, PollRound, Pool
from pool.selectors import NO_POOL, busy_threshold
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu, Tenant
from scheduler.selectors import QUEUED_STATES, REASON_LABELS

DEFAULT_WINDOW_S = 900.0
CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
POLL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# What a GPU is doing, one word each; every GPU the pool knows is in exactly one, checked
# in this order: held by an active placement (busy or idle by its utilization), no longer
# reported, on a host whose agent runs no work, on an unhealthy host, on a draining host,
# busy with work the scheduler does not know, else free.
GPU_STATES = ("allocated", "idle_allocated", "missing", "unmanaged", "unhealthy", "draining", "foreign", "free")
UNHEALTHY_HOST_STATES = (Host.State.STALE, Host.State.UNREACHABLE, Host.State.DOWN, Host.State.NEW)
OTHER_REASON = "other"  # a pending reason the dashboard does not know (keeps the label set bounded)
QUEUE_REASONS = tuple(REASON_LABELS) + (OTHER_REASON,)


def window_s() -> float:
    return float(getattr(settings, "METRICS_WINDOW_S", DEFAULT_WINDOW_S))


def _pool_label(name) -> str:
    return name or NO_POOL


def _gpu_state_expression(now):
    held = Exists(PlacementGpu.objects.filter(gpu=OuterRef("pk"), active=True))
    idle = Q(utilization__lt=busy_threshold())
    # The held subquery appears once (nested Case): it runs once per GPU row.
    allocated = Case(When(idle, then=Value("idle_allocated")), default=Value("allocated"), output_field=CharField())
    return Case(
        When(held, then=allocated),
        When(present=False, then=Value("missing")),
        When(~Q(host__agent_kind=Host.AgentKind.FABRICPOOL), then=Value("unmanaged")),
        When(host__state__in=UNHEALTHY_HOST_STATES, then=Value("unhealthy")),
        When(host__state=Host.State.DRAINING, then=Value("draining")),
        When(foreign_busy_until__gt=now, then=Value("foreign")),
        default=Value("free"),
        output_field=CharField(),
    )


def _histogram(name, documentation, values, buckets):
    counts = [sum(1 for v in values if v <= bound) for bound in buckets]
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], [(repr(float(b)), c) for b, c in zip(buckets, counts)] + [("+Inf", len(values))],
                      sum_value=float(sum(values)))
    return family


class FabricPoolCollector:
    """A prometheus_client collector: collect() queries the database on every scrape."""

    def collect(self):
        now = timezone.now()
        pools = [_pool_label(name) for name in Pool.objects.order_by("name").values_list("name", flat=True)]
        if Host.objects.filter(pool__isnull=True).exists():
            pools.append(NO_POOL)
        yield from self._gpus(pools, now)
        yield from self._tenants()
        yield from self._queue(pools)
        yield from self._hosts(pools)
        yield from self._links()
        yield from self._durations(now)

    # --- GPUs and utilization -----------------------------------------------------------

    def _gpus(self, pools, now):
        gpus = GaugeMetricFamily("fabricpool_gpus", "GPUs by pool and what they are doing now.", labels=["pool", "state"])
        counts = {(pool, state): 0 for pool in pools for state in GPU_STATES}
        # One pass over the GPUs: state counts, and the utilization sum of those with a fresh reading.
        reporting = Q(present=True, utilization__isnull=False, host__state__in=(Host.State.UP, Host.State.DRAINING))
        rows = (Gpu.objects.annotate(gpu_state=_gpu_state_expression(now))
                .values("host__pool__name", "gpu_state")
                .annotate(n=Count("id"), util_sum=Sum("utilization", filter=reporting), util_n=Count("id", filter=reporting))
                .order_by())
        util = {pool: [0.0, 0] for pool in pools}
        for row in rows:
            pool = _pool_label(row["host__pool__name"])
            counts[pool, row["gpu_state"]] = row["n"]
            entry = util.setdefault(pool, [0.0, 0])  # a pool created since the pool query
            entry[0] += row["util_sum"] or 0.0
            entry[1] += row["util_n"]
        for (pool, state), n in sorted(counts.items()):
            gpus.add_metric([pool, state], n)
        yield gpus

        utilization = GaugeMetricFamily(
            "fabricpool_pool_gpu_utilization_ratio",
            "Mean latest utilization (0-1) of the pool's present GPUs on hosts that report (up or draining).",
            labels=["pool"])
        allocation = GaugeMetricFamily(
            "fabricpool_pool_gpu_allocation_ratio",
            "Share (0-1) of the pool's present GPUs held by active placements.", labels=["pool"])
        mean = {pool: total / n if n else None for pool, (total, n) in util.items()}
        for pool in pools:
            utilization.add_metric([pool], 0.0 if mean[pool] is None else min(max(mean[pool] / 100.0, 0.0), 1.0))
            total = sum(counts[pool, state] for state in GPU_STATES if state != "missing")
            taken = counts[pool, "allocated"] + counts[pool, "idle_allocated"]
            allocation.add_metric([pool], taken / total if total else 0.0)
        yield utilization
        yield allocation

    def _tenants(self):
        allocated = GaugeMetricFamily(
            "fabricpool_tenant_allocated_gpus",
            "GPUs held by the tenant's active placements (shared GPUs count by their share).", labels=["tenant"])
        utilization = GaugeMetricFamily(
            "fabricpool_tenant_gpu_utilization_ratio",
            "Mean latest utilization (0-1) of the GPUs held by the tenant's active placements.", labels=["tenant"])
        rows = {name: (0.0, None) for name in Tenant.objects.order_by("name").values_list("name", flat=True)}
        for row in (PlacementGpu.objects.filter(active=True).values("placement__job__tenant__name")
                    .annotate(milli=Sum("share_milli"), avg=Avg("gpu__utilization")).order_by()):
            rows[row["placement__job__tenant__name"]] = ((row["milli"] or 0) / 1000.0, row["avg"])
        for tenant, (gpus, avg) in sorted(rows.items()):
            allocated.add_metric([tenant], gpus)
            utilization.add_metric([tenant], 0.0 if avg is None else min(max(avg / 100.0, 0.0), 1.0))
        yield allocated
        yield utilization

    # --- scheduler queue and proposals ----------------------------------------------------

    def _queue(self, pools):
        queue = GaugeMetricFamily("fabricpool_queue_jobs", "Jobs waiting in the queue, by pool and the reason they wait.",
                                  labels=["pool", "reason"])
        counts = {(pool, reason): 0 for pool in pools for reason in QUEUE_REASONS}
        for row in (Job.objects.filter(state__in=QUEUED_STATES).values("pool__name", "pending_reason")
                    .annotate(n=Count("id")).order_by()):
            reason = row["pending_reason"] or "new"
            key = (_pool_label(row["pool__name"]), reason if reason in REASON_LABELS else OTHER_REASON)
            counts[key] = counts.get(key, 0) + row["n"]
        for (pool, reason), n in sorted(counts.items()):
            queue.add_metric([pool, reason], n)
        yield queue

        waiting = GaugeMetricFamily("fabricpool_proposals_waiting",
                                    "Proposed placements waiting for an operator's decision.", labels=["pool"])
        oldest = GaugeMetricFamily("fabricpool_proposal_oldest_age_seconds",
                                   "Age of the oldest proposal waiting for a decision (0 when none waits).", labels=["pool"])
        now = timezone.now()
        by_pool = {pool: (0, None) for pool in pools}
        for row in (Placement.objects.filter(state=Placement.State.PROPOSED).values("job__pool__name")
                    .annotate(n=Count("id"), first=Min("created_at")).order_by()):
            by_pool[_pool_label(row["job__pool__name"])] = (row["n"], row["first"])
        for pool, (n, first) in sorted(by_pool.items()):
            waiting.add_metric([pool], n)
            oldest.add_metric([pool], max((now - first).total_seconds(), 0.0) if first else 0.0)
        yield waiting
        yield oldest

    # --- agents and fabric --------------------------------------------------------------

    def _hosts(self, pools):
        hosts = GaugeMetricFamily("fabricpool_hosts", "Hosts by pool and state (what their agents report).",
                                  labels=["pool", "state"])
        up = GaugeMetricFamily("fabricpool_agents_up", "Hosts whose agent answered the latest poll rounds (state up).",
                               labels=["pool"])
        counts = {(pool, state): 0 for pool in pools for state in Host.State.values}
        for row in Host.objects.values("pool__name", "state").annotate(n=Count("id")).order_by():
            counts[_pool_label(row["pool__name"]), row["state"]] = row["n"]
        for (pool, state), n in sorted(counts.items()):
            hosts.add_metric([pool, state], n)
        for pool in pools:
            up.add_metric([pool], counts[pool, Host.State.UP])
        yield hosts
        yield up

    def _links(self):
        links = GaugeMetricFamily("fabricpool_links", "InfiniBand links by fabric and state.", labels=["fabric", "state"])
        counts = {(fabric, state): 0 for fabric in Fabric.objects.values_list("name", flat=True)
                  for state in Link.State.values}
        for row in Link.objects.values("fabric__name", "state").annotate(n=Count("id")).order_by():
            counts[row["fabric__name"], row["state"]] = row["n"]
        for (fabric, state), n in sorted(counts.items()):
            links.add_metric([fabric, state], n)
        yield links

    # --- durations ------------------------------------------------------------------------

    def _durations(self, now):
        since = now - timedelta(seconds=window_s())
        cycles = [sum(parts) for parts in AllocationCycle.objects.filter(
            started_at__gte=since, snapshot_s__isnull=False, plan_s__isnull=False, persist_s__isnull=False,
        ).values_list("snapshot_s", "plan_s", "persist_s").order_by()]
        yield _histogram("fabricpool_allocation_cycle_duration_seconds",
                         f"Allocation cycle duration (snapshot + plan + persist) of the cycles started in the last "
                         f"{window_s():g} s.", cycles, CYCLE_BUCKETS)
        rounds = list(PollRound.objects.filter(started_at__gte=since, duration_s__isnull=False)
                      .values_list("duration_s", flat=True).order_by())
        yield _histogram("fabricpool_poll_round_duration_seconds",
                         f"Poll round duration of the finished rounds started in the last {window_s():g} s.",
                         rounds, POLL_BUCKETS)

        last = GaugeMetricFamily("fabricpool_last_run_timestamp_seconds",
                                 "Unix time the latest allocation cycle or poll round started (0: never).",
                                 labels=["kind"])
        for kind, model in (("allocation_cycle", AllocationCycle), ("poll_round", PollRound)):
            started = model.objects.aggregate(t=Max("started_at"))["t"]
            last.add_metric([kind], started.timestamp() if started else 0.0)
        yield last


registry = CollectorRegistry(auto_describe=False)
registry.register(FabricPoolCollector())
