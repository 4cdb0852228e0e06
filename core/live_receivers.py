"""What the live views publish when something happens elsewhere. Connected in CoreConfig.ready.

Every receiver runs after its transaction commits (the signals are sent then) and never
raises: a failure (Redis down, a query failing) is logged and counted in core.live.stats, and
the poll round, cycle or decision that sent the signal goes on untouched.
"""
from __future__ import annotations

import functools
import logging

import redis
from django.db import transaction

from . import live
from . import live_snapshots as snapshots

log = logging.getLogger(__name__)

# A GPU's values are pushed again only when one moved by at least this much since its last push.
GPU_THRESHOLDS = (2.0, 256, 2.0)  # utilization %, memory MiB, temperature °C


def _small_gpu_change(old, new) -> bool:
    for a, b, limit in zip(old, new, GPU_THRESHOLDS):
        if (a is None) != (b is None):
            return False
        if a is not None and abs(a - b) >= limit:
            return False
    return True


def _never_raises(receiver):
    @functools.wraps(receiver)
    def wrapper(*args, **kwargs):
        try:
            receiver(*args, **kwargs)
        except Exception as exc:
            live.stats["failed"] += 1
            # Redis down is an outage to note, not a bug: no traceback for it.
            log.warning("live update after %s failed: %s", receiver.__name__, exc,
                        exc_info=not isinstance(exc, redis.RedisError))
    return wrapper


def publish_overview() -> None:
    live.publish(live.OVERVIEW, "overview", live.changed_values("overview", snapshots.overview()))


def publish_gpus(host_ids) -> None:
    host_of: dict[str, int] = {}  # from the same query (a second one cost ~30 ms a chunk)
    changed = live.changed_values("gpu", snapshots.gpu_values(host_ids, host_of), same=_small_gpu_change)
    if not changed:
        return
    per_host: dict[int, dict] = {}
    for gpu_id, values in changed.items():
        per_host.setdefault(host_of[gpu_id], {})[gpu_id] = values
    live.publish_many([(live.POOL, "gpus", changed)] +
                      [(live.host_group(host_id), "gpus", values) for host_id, values in per_host.items()])


def publish_host_states() -> None:
    changed = live.changed_values("host_state", snapshots.host_states())
    live.publish_many([(live.POOL, "hosts", changed)] +
                      [(live.host_group(int(host_id)), "host", {"state": state}) for host_id, state in changed.items()])


def _small_topology_change(old, new) -> bool:
    # [state, mean utilization, busy GPUs, tenant]: only the utilization may drift a little.
    if old[0] != new[0] or old[2:] != new[2:] or (old[1] is None) != (new[1] is None):
        return False
    return old[1] is None or abs(old[1] - new[1]) < GPU_THRESHOLDS[0]


def publish_topology(host_ids=None, links=False) -> None:
    """Topology colours of these hosts (None: all) and, with links, every drawn link's state."""
    from .live_consumers import TOPOLOGY

    deltas = [(TOPOLOGY, "hosts", live.changed_values("topo_host", snapshots.topology_hosts(host_ids),
                                                      same=_small_topology_change))]
    if links:
        deltas.append((TOPOLOGY, "links", live.changed_values("topo_link", snapshots.topology_links())))
    live.publish_many(deltas)


def _placement_hosts(job_ids) -> list[int]:
    from scheduler.models import PlacementGpu

    return list(PlacementGpu.objects.filter(placement__job_id__in=job_ids).values_list("gpu__host_id", flat=True).distinct())


def publish_jobs(job_ids) -> None:
    """Queue rows of these jobs (None: left the queue), their proposals (None: decided) and
    the GPUs their placements hold or released."""
    from scheduler.models import Placement, PlacementGpu

    queued = snapshots.jobs(job_ids)
    live.publish(live.QUEUE, "jobs", {str(j): queued.get(str(j)) for j in job_ids})
    waiting = snapshots.proposals(job_ids)
    placement_ids = Placement.objects.filter(job_id__in=job_ids).values_list("id", flat=True)
    live.publish(live.QUEUE, "proposals", {str(p): waiting.get(str(p)) for p in placement_ids})
    gpu_ids = set(PlacementGpu.objects.filter(placement_id__in=placement_ids).values_list("gpu_id", flat=True))
    held = snapshots.allocations(gpu_ids)
    alloc = live.changed_values("alloc", {str(g): held.get(str(g), 0) for g in gpu_ids})
    live.publish(live.POOL, "alloc", alloc)


@_never_raises
def after_poll_chunk(sender, reports, **kwargs):
    publish_gpus([host_id for host_id, _, _ in reports])
    publish_host_states()
    publish_overview()
    publish_topology([host_id for host_id, _, _ in reports])


@_never_raises
def after_job_state_change(sender, job_ids, **kwargs):
    publish_jobs(list(job_ids))
    publish_overview()
    publish_topology(_placement_hosts(list(job_ids)))


@_never_raises
def after_placements_change(sender, placement_ids, **kwargs):
    from scheduler.models import Placement

    job_ids = list(Placement.objects.filter(pk__in=placement_ids).values_list("job_id", flat=True).distinct())
    publish_jobs(job_ids)
    publish_overview()
    publish_topology(_placement_hosts(job_ids))


@_never_raises
def after_cycle_commit():
    # Host states too: a change that came without a good report in its poll chunk (every host
    # of the chunk unreachable: no allocations_reported) reaches the views within a cycle.
    publish_host_states()
    publish_overview()
    publish_topology(links=True)


def after_cycle_saved(sender, instance, created, **kwargs):
    # A cycle's row is made inside its transaction; what it wrote is visible after the commit.
    if created:
        transaction.on_commit(after_cycle_commit)


@_never_raises
def after_topology_import(sender, fabric, result=None, **kwargs):
    publish_host_states()
    publish_overview()
    # Hosts may have joined: the pool view's arrays change shape, so its clients reload.
    live.publish(live.POOL, "resync", {})
    # The topology page draws positions fixed at load: it offers a reload for its fabric.
    from .live_consumers import TOPOLOGY

    live.publish(TOPOLOGY, "fabric", {fabric.name: snapshots._ms(snapshots.timezone.now())})
    publish_topology(links=True)


@_never_raises
def after_link_health(sender=None, **kwargs):
    """A link health check (fabric.tasks.check_link_health, in a Celery worker) set link states."""
    if getattr(sender, "name", "") != "fabric.tasks.check_link_health":
        return
    publish_topology(links=True)
    publish_overview()


def _connect_first(signal, receiver, dispatch_uid: str) -> None:
    """Connect `receiver` ahead of the signal's other receivers. After a poll chunk the
    scheduler's reconciliation (connected first, by app order) ran before the dashboards
    heard of the chunk; the live receiver only reads committed rows and never raises, so it
    may as well go first. Django has no API for the order: this reorders its list, and
    leaves the order alone (still connected) if that list ever looks different."""
    signal.connect(receiver, dispatch_uid=dispatch_uid)
    try:
        with signal.lock:
            mine = [r for r in signal.receivers if r[0][0] == dispatch_uid]
            if len(mine) == 1:
                signal.receivers = mine + [r for r in signal.receivers if r[0][0] != dispatch_uid]
                signal.sender_receivers_cache.clear()
    except Exception as exc:  # noqa: BLE001 - only the order is lost
        log.warning("live: could not put %s first: %s", dispatch_uid, exc)


def connect():
    from django.db.models.signals import post_save

    from fabric.signals import topology_imported
    from pool.signals import allocations_reported
    from scheduler import signals
    from scheduler.models import AllocationCycle

    _connect_first(allocations_reported, after_poll_chunk, "core.live.poll")
    signals.job_state_changed.connect(after_job_state_change, dispatch_uid="core.live.jobs")
    signals.placements_approved.connect(after_placements_change, dispatch_uid="core.live.approved")
    signals.placements_stop_requested.connect(after_placements_change, dispatch_uid="core.live.stop")
    post_save.connect(after_cycle_saved, sender=AllocationCycle, dispatch_uid="core.live.cycle")
    topology_imported.connect(after_topology_import, dispatch_uid="core.live.topology")
    from celery.signals import task_postrun

    task_postrun.connect(after_link_health, weak=False, dispatch_uid="core.live.link_health")
