"""Publishing live deltas to the dashboards' Channels groups.

Groups: "live.overview", "live.queue", "live.pool" and "live.host.<host id>". A delta is a
`kind` ("gpus", "hosts", "jobs", "proposals", "alloc", "overview", or "resync") with a
payload mapping keys to their new value (None: the key is gone). Merging two deltas of a
kind is therefore a dict update, later wins, and a delta only ever carries what changed.

Design, and why:

* Publishers (Celery poll and cycle workers, the web process taking decisions) call
  publish() after their transaction commits. Each publish takes the group's next sequence
  number from one Redis counter (INCR: monotonic across every process) and goes to the
  group at once; a publisher never waits for or batches with another process.
* Coalescing happens in each consumer (core.live_consumers): it merges what arrives during a
  window (LIVE_FLUSH_INTERVAL_S, 250 ms) and sends one message per window at most, so a
  browser gets at most a few messages a second however many workers publish and however
  busy the cluster is. Rate limiting at the publisher (Redis keys) would have to drop or
  defer deltas it never sends again; merging at the consumer loses nothing.
* The consumer checks the sequence numbers it receives: a hole (the channel layer dropped
  messages of a slow client) becomes a fresh snapshot instead of a wrong picture; the
  browser checks the numbers of what it gets and asks for a resync on a hole too.
* "Only what changed" is decided here, against the last values pushed, kept in Redis hashes
  (changed_values) so every worker compares against the same state: a GPU's utilization
  moving by less than the threshold since its last push sends nothing.
* Publishing must never break a poll round, a cycle or a decision: every failure (Redis
  down, a slow channel layer) is caught, logged and counted in `stats`.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)

OVERVIEW = "live.overview"
QUEUE = "live.queue"
POOL = "live.pool"
SEND_TIMEOUT_S = 2.0

# Counters of this process: published, failed (read by tests and benchmarks).
stats: Counter = Counter()


def host_group(host_id: int) -> str:
    return f"live.host.{host_id}"


def _prefix() -> str:
    return getattr(settings, "LIVE_KEY_PREFIX", "fabricpool:live:")


_clients: dict[str, redis.Redis] = {}


def redis_client() -> redis.Redis:
    """One client (and connection pool) per Redis URL and process; redis-py is thread-safe."""
    url = settings.REDIS_URL
    if url not in _clients:
        # Short timeouts: a dead Redis costs a poll round a fraction of a second, not minutes.
        _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1.0)
    return _clients[url]


def current_seq(group: str) -> int:
    """The group's latest sequence number (0 before the first publish)."""
    value = redis_client().get(f"{_prefix()}seq:{group}")
    return int(value or 0)


def publish(group: str, kind: str, payload: dict) -> bool:
    """Send one delta to a group. Returns False (logged, counted) when it could not be sent;
    never raises."""
    return publish_many([(group, kind, payload)])


def publish_many(deltas) -> bool:
    """Send deltas [(group, kind, payload)] in one go: one Redis round trip for their sequence
    numbers and one event loop for the sends (a poll chunk touches hundreds of host groups).
    Returns False (logged, counted) when they could not be sent; never raises."""
    deltas = [(g, k, p) for g, k, p in deltas if p or k == "resync"]
    if not deltas:
        return True
    try:
        pipe = redis_client().pipeline(transaction=False)
        for group, _, _ in deltas:
            pipe.incr(f"{_prefix()}seq:{group}")
        seqs = pipe.execute()
        layer = get_channel_layer()

        async def send():
            await asyncio.wait_for(asyncio.gather(*(
                layer.group_send(group, {"type": "live.delta", "seq": seq, "kind": kind, "payload": payload})
                for (group, kind, payload), seq in zip(deltas, seqs))), SEND_TIMEOUT_S)

        async_to_sync(send)()
    except Exception as exc:  # noqa: BLE001 - the caller's work is done and committed
        stats["failed"] += 1
        log.warning("live update %s not sent: %s", ", ".join(sorted({f"{k} to {g}" for g, k, _ in deltas})[:5]), exc)
        return False
    stats["published"] += len(deltas)
    return True


def merge(changes: dict, kind: str, payload: dict) -> None:
    """Fold one delta into the pending changes of a window (later wins per key)."""
    changes.setdefault(kind, {}).update(payload)


def changed_values(name: str, values: dict, same=None) -> dict:
    """The entries of `values` that differ from the last pushed ones (kept in a Redis hash
    named `name`); those become the last pushed. `same(old, new)` says whether a change is
    too small to push (the old value stays the reference, so small drifts add up)."""
    if not values:
        return {}
    r = redis_client()
    key = f"{_prefix()}last:{name}"
    keys = [str(k) for k in values]
    olds = r.hmget(key, keys)
    changed = {}
    for k, old in zip(keys, olds):
        new = values[k] if k in values else values[int(k)]
        if old is not None:
            old = json.loads(old)
            if old == new or (same is not None and same(old, new)):
                continue
        changed[k] = new
    if changed:
        r.hset(key, mapping={k: json.dumps(v) for k, v in changed.items()})
    return changed
