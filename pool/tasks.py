"""Celery tasks of the pool: poll rounds and telemetry rollups. Beat starts them (rows made
by migration 0003_schedule); they also run by hand: `poll_round.delay()`.

A poll round fans out over the workers: poll_round splits the pollable hosts into chunks
of POLL_CHUNK_SIZE and sends one poll_chunk task per chunk (a Celery group). Each chunk
fetches its agents concurrently (pool.poller), then writes everything in one transaction
(pool.ingest) together with its counts on the PollRound row; the chunk that finds every
chunk done closes the round.

Rounds never pile up. A round holds a Redis lock from its start until its last chunk
finishes; the next beat tick that finds it held logs "previous round still running" and
skips. The lock is in Redis, not a database row lock, because it spans several tasks in
several worker processes (no transaction can be held across them, and SQLite has no
SKIP LOCKED). It carries a TTL a little above three intervals: a worker killed mid-round
never releases it, and the lock expires by itself; chunk messages expire at the same TTL,
so a chunk that could not start in time is dropped rather than run late, and the round
it belonged to is marked abandoned by the next round.
"""
from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

import redis
from celery import group, shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agent.protocol import derive_token

from core import faults

from . import ingest, poller, rollups
from .models import Host, PollRound
from .tokens import agent_secret

log = logging.getLogger(__name__)

ROUND_LOCK = "fabricpool:lock:pool-poll-round"
PRUNE_LOCK = "fabricpool:lock:pool-rollups"
# Delete the key only if it still holds our token (it may have expired and been retaken).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=5)


def round_lock_ttl() -> float:
    return float(settings.POLL_INTERVAL) * 3 + 5


def release_lock(key: str, token: str) -> bool:
    try:
        return bool(_redis().eval(_RELEASE, 1, key, token))
    except redis.RedisError as exc:
        log.warning("could not release %s (%s); it expires by itself", key, exc)
        return False


def limits_from_settings() -> poller.Limits:
    return poller.Limits(
        connect_timeout=float(settings.POLL_CONNECT_TIMEOUT),
        read_timeout=float(settings.POLL_READ_TIMEOUT),
        concurrency=int(settings.POLL_CONCURRENCY),
    )


def pollable_hosts():
    return Host.objects.exclude(agent_kind=Host.AgentKind.NONE).exclude(agent_url="")


def targets_for(host_ids) -> list[poller.Target]:
    secret = agent_secret()
    rows = pollable_hosts().filter(pk__in=list(host_ids)).order_by("id").values_list(
        "id", "name", "agent_url", "agent_kind", "ib_metrics_url")
    return [
        poller.Target(pk, name, url, derive_token(secret, name) if kind == Host.AgentKind.FABRICPOOL else "", kind, ib_url)
        for pk, name, url, kind, ib_url in rows
    ]


def poll_hosts(host_ids, *, deadline: float | None = None) -> ingest.IngestStats:
    """Fetch and ingest these hosts now (the body of a chunk; also for tests and benchmarks)."""
    results = poller.fetch_sync(targets_for(host_ids), limits_from_settings(), deadline=deadline)
    return ingest.apply_results(results)


# Time limits: a round only lists hosts and sends chunks; a chunk fetches within its deadline
# (under POLL_INTERVAL) and writes for well under a second; rollups can take minutes.
@shared_task(name="pool.tasks.poll_round", ignore_result=True, soft_time_limit=30, time_limit=60)
def poll_round() -> dict:
    interval = float(settings.POLL_INTERVAL)
    ttl = round_lock_ttl()
    token = uuid.uuid4().hex
    try:
        acquired = _redis().set(ROUND_LOCK, token, nx=True, px=int(ttl * 1000))
    except redis.RedisError as exc:
        log.error("poll round not started: cannot take its lock in Redis (%s)", exc)
        return {"ok": False, "error": f"cannot take the poll round lock in Redis: {exc}"}
    if not acquired:
        log.warning("poll round skipped: previous round still running")
        return {"ok": False, "skipped": "previous round still running"}
    try:
        # Rounds whose chunks never all came back (worker killed, messages expired).
        PollRound.objects.filter(finished_at__isnull=True, abandoned=False,
                                 started_at__lt=timezone.now() - timedelta(seconds=ttl)).update(abandoned=True)
        host_ids = list(pollable_hosts().order_by("id").values_list("id", flat=True))
        size = max(1, int(settings.POLL_CHUNK_SIZE))
        chunks = [host_ids[i:i + size] for i in range(0, len(host_ids), size)]
        round_ = PollRound.objects.create(hosts=len(host_ids), chunks=len(chunks))
        if not chunks:
            PollRound.objects.filter(pk=round_.pk).update(finished_at=timezone.now(), duration_s=0.0)
            release_lock(ROUND_LOCK, token)
            return {"ok": True, "round": round_.pk, "hosts": 0, "chunks": 0}
        deadline = max(interval * 0.8, limits_from_settings().request_timeout)
        group(poll_chunk.si(round_.pk, ids, token, deadline) for ids in chunks).apply_async(expires=ttl)
    except Exception:
        release_lock(ROUND_LOCK, token)
        raise
    log.info("poll round %s: %s hosts in %s chunks", round_.pk, len(host_ids), len(chunks))
    return {"ok": True, "round": round_.pk, "hosts": len(host_ids), "chunks": len(chunks)}


@shared_task(name="pool.tasks.poll_chunk", ignore_result=True, soft_time_limit=120, time_limit=180)
def poll_chunk(round_id: int, host_ids: list[int], lock_token: str = "", deadline: float | None = None) -> dict:
    results = poller.fetch_sync(targets_for(host_ids), limits_from_settings(), deadline=deadline)
    with transaction.atomic():
        stats = ingest.apply_results(results)
        faults.pause_point("poll.ingest")  # reliability tests kill the worker here, mid-transaction
        closed = _chunk_done(round_id, stats)
    if closed is not None:
        if lock_token:
            release_lock(ROUND_LOCK, lock_token)
        if closed.overran:
            log.warning("poll round %s overran: %.1f s for %s hosts (interval %s s); the next one may skip",
                        closed.pk, closed.duration_s, closed.hosts, settings.POLL_INTERVAL)
        else:
            log.info("poll round %s done in %.2f s: %s ok, %s errors", closed.pk, closed.duration_s, closed.hosts_ok, closed.hosts_error)
    return {"round": round_id, "ok": stats.hosts_ok, "errors": stats.hosts_error, "gpu_samples": stats.gpu_samples}


def _chunk_done(round_id: int, stats: ingest.IngestStats) -> PollRound | None:
    """Count this chunk on its round; the chunk that completes the round closes it and gets it back."""
    PollRound.objects.filter(pk=round_id).update(
        chunks_done=F("chunks_done") + 1, hosts_ok=F("hosts_ok") + stats.hosts_ok,
        hosts_error=F("hosts_error") + stats.hosts_error, gpu_samples=F("gpu_samples") + stats.gpu_samples)
    round_ = PollRound.objects.filter(pk=round_id).first()
    if round_ is None or round_.chunks_done < round_.chunks or round_.finished_at is not None:
        return None
    now = timezone.now()
    round_.finished_at = now
    round_.duration_s = (now - round_.started_at).total_seconds()
    round_.overran = round_.duration_s > float(settings.POLL_INTERVAL)
    PollRound.objects.filter(pk=round_id, finished_at__isnull=True).update(
        finished_at=now, duration_s=round_.duration_s, overran=round_.overran)
    return round_


@shared_task(name="pool.tasks.prune_samples", ignore_result=True, soft_time_limit=1500, time_limit=1800)
def prune_samples() -> dict:
    """Rollups (1 min, 1 h) and retention. One run at a time (a Redis lock, as above)."""
    token = uuid.uuid4().hex
    try:
        if not _redis().set(PRUNE_LOCK, token, nx=True, ex=3600):
            log.info("rollups skipped: another run is in progress")
            return {"ok": False, "skipped": "another rollup run is in progress"}
    except redis.RedisError as exc:
        log.error("rollups not run: cannot take the lock in Redis (%s)", exc)
        return {"ok": False, "error": str(exc)}
    started = time.monotonic()
    try:
        result = rollups.prune()
    finally:
        release_lock(PRUNE_LOCK, token)
    summary = {"ok": True, "rolled_up": result.rolled_up, "deleted": result.deleted, "seconds": round(time.monotonic() - started, 2)}
    log.info("rollups and retention: %s", summary)
    return summary
