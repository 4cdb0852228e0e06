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
* Coalescing happens in each server process (core.live_consumers.GroupHub, one per group
  with clients there): it merges what arrives during a window (LIVE_FLUSH_INTERVAL_S,
  250 ms), encodes it once and every client of the group gets that text: one message per
  window at most, so a browser gets at most a few messages a second however many workers
  publish and however busy the cluster is. Rate limiting at the publisher (Redis keys)
  would have to drop or defer deltas it never sends again; merging at the receiver loses
  nothing. Only the hubs are channel-layer group members, so a delta crosses Redis once per
  server process, and groups nobody watches (most "live.host.<id>") are not sent to.
* The hub checks the sequence numbers it receives: a hole (the channel layer dropped
  messages) becomes a fresh snapshot for its clients instead of a wrong picture; the
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
        seqs = _script(_INCR_ALL)(args=[json.dumps([f"{_prefix()}seq:{group}" for group, _, _ in deltas])])
        layer = get_channel_layer()

        async def send():
            listened = await _listened(layer, [group for group, _, _ in deltas])
            await asyncio.wait_for(asyncio.gather(*(
                layer.group_send(group, {"type": "live.delta", "seq": seq, "kind": kind, "payload": payload})
                for (group, kind, payload), seq in zip(deltas, seqs) if group in listened)), SEND_TIMEOUT_S)

        async_to_sync(send)()
    except Exception as exc:  # noqa: BLE001 - the caller's work is done and committed
        stats["failed"] += 1
        log.warning("live update %s not sent: %s", ", ".join(sorted({f"{k} to {g}" for g, k, _ in deltas})[:5]), exc)
        return False
    stats["published"] += len(deltas)
    return True


async def _listened(layer, groups: list[str]) -> set[str]:
    """The groups with a member (a server process whose clients show that view). A poll chunk
    touches hundreds of host groups that nobody watches; a group_send costs several Redis
    round trips even to an empty group, and sending 257 of them made the pool view's delta
    wait ~0.5 s for the host groups' (one pipeline of EXISTS instead). Safe against a member
    joining meanwhile: the sequence numbers were taken first, and a member reads its
    group's number after joining, so what it missed is in its snapshot.
    Other channel layers than channels_redis's: every group."""
    if not hasattr(layer, "_group_key") or not hasattr(layer, "consistent_hash"):
        return set(groups)
    by_shard: dict[int, list[str]] = {}
    for group in groups:
        by_shard.setdefault(layer.consistent_hash(group), []).append(group)
    listened = set()
    for index, names in by_shard.items():
        pipe = layer.connection(index).pipeline(transaction=False)
        for group in names:
            pipe.exists(layer._group_key(group))
        listened.update(group for group, exists in zip(names, await pipe.execute()) if exists)
    return listened


def merge(changes: dict, kind: str, payload: dict) -> None:
    """Fold one delta into the pending changes of a window (later wins per key)."""
    changes.setdefault(kind, {}).update(payload)


def changed_values(name: str, values: dict, same=None) -> dict:
    """The entries of `values` that differ from the last pushed ones (kept in a Redis hash
    named `name`); those become the last pushed. `same(old, new)` says whether a change is
    too small to push (the old value stays the reference, so small drifts add up)."""
    if not values:
        return {}
    key = f"{_prefix()}last:{name}"
    keys = [str(k) for k in values]
    olds = json.loads(_script(_READ_LAST)(keys=[key], args=[json.dumps(keys)]))
    changed = {}
    for k, old in zip(keys, olds):
        new = values[k] if k in values else values[int(k)]
        if old != 0 and (old[0] == new or (same is not None and same(old[0], new))):
            continue  # old: [the value last pushed], or 0 when none was
        changed[k] = new
    if changed:
        _script(_WRITE_LAST)(keys=[key], args=[json.dumps([x for k, v in changed.items() for x in (k, json.dumps(v))])])
    return changed


# HMGET and HSET of thousands of fields (a poll chunk's GPUs) with one argument each way:
# redis-py packs every argument in Python, and 4,096 GPUs took ~0.5 s of the poll chunk's
# time to the dashboards on a busy machine. The stored values are JSON texts, so the read
# returns one JSON array of them ([value], or 0: none yet). Batches: Lua's unpack() has a limit.
_READ_LAST = """
local fields = cjson.decode(ARGV[1])
local out = {}
for i = 1, #fields, 1000 do
  local got = redis.call('HMGET', KEYS[1], unpack(fields, i, math.min(i + 999, #fields)))
  for j = 1, math.min(1000, #fields - i + 1) do
    out[#out + 1] = got[j] and ('[' .. got[j] .. ']') or '0'
  end
end
return '[' .. table.concat(out, ',') .. ']'
"""
_WRITE_LAST = """
local flat = cjson.decode(ARGV[1])  -- field, value, field, value...
for i = 1, #flat, 1000 do
  redis.call('HSET', KEYS[1], unpack(flat, i, math.min(i + 999, #flat)))
end
return #flat
"""
# The sequence numbers of a poll chunk's ~500 groups in one argument (a pipeline of 500 INCRs
# cost ~40 ms of packing and parsing in redis-py on a busy machine). Keys passed as an
# argument: fine on one Redis, which is what the project runs (not Redis Cluster).
_INCR_ALL = """
local out = {}
for i, key in ipairs(cjson.decode(ARGV[1])) do
  out[i] = redis.call('INCR', key)
end
return out
"""
_scripts: dict = {}


def _script(source: str):
    client = redis_client()
    if (client, source) not in _scripts:
        _scripts[(client, source)] = client.register_script(source)
    return _scripts[(client, source)]
