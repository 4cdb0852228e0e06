"""Websocket consumers of the live views: login, role and origin are checked before
(AuthenticatedConsumer, config.asgi); then the consumer joins its view's group, sends the
snapshot and forwards deltas, coalesced (core.live explains the design).

Every client of a group in one process (and event loop) shares a GroupHub: the hub alone is
in the channel-layer group, merges each window's deltas and encodes them once, and each
consumer sends that same text to its browser (with its own `since` when it differs).

Messages to the browser:
  {"type": "snapshot", "seq": N, "data": {...}}
  {"type": "delta", "since": M, "seq": N, "changes": {kind: {key: value}}}
      (apply only when `since` is the seq of what the client holds; otherwise send resync)
  {"type": "error", "message": "..."}
From the browser: {"type": "resync"} (a fresh snapshot), {"type": "ping"} (a pong).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from pool.models import Host

from . import live
from . import live_snapshots as snapshots
from .consumers import AuthenticatedConsumer

log = logging.getLogger(__name__)
CLOSE_NOT_FOUND = 4404
TOPOLOGY = "live.topology"  # here, not in core.live: that module is being reworked alongside


def flush_interval() -> float:
    return float(getattr(settings, "LIVE_FLUSH_INTERVAL_S", 0.25))


def member_check_interval() -> float:
    return float(getattr(settings, "LIVE_MEMBER_CHECK_S", 5.0))


def dumps(data) -> str:
    # No spaces after , and : (the same JSON): the pool view's deltas are 13 % smaller and
    # its snapshot 15 %.
    return json.dumps(data, separators=(",", ":"))


class Frame:
    """One window of a group's deltas, merged and encoded once for every local client; or a
    resync (changes None: something was lost, every client needs a fresh snapshot)."""

    __slots__ = ("since", "seq", "resync", "restart", "body", "_text")

    def __init__(self, since: int, seq: int, changes: dict | None, restart: bool = False):
        self.since, self.seq = since, seq
        self.resync = changes is None
        # The sequence numbers started again (Redis restarted, forgetting its counters): seq
        # is not comparable with what clients hold, every client needs a fresh snapshot.
        self.restart = restart
        self.body = None if changes is None else dumps(changes)
        self._text = None

    def text(self, since: int) -> str:
        """The delta message for a client holding `since`; the usual case (since is the
        frame's) is one string shared by every client."""
        if since != self.since:
            return self._build(since)
        if self._text is None:
            self._text = self._build(since)
        return self._text

    def _build(self, since: int) -> str:
        # Byte for byte what send_json({"type": "delta", "since", "seq", "changes"}) sends.
        return f'{{"type":"delta","since":{since},"seq":{self.seq},"changes":{self.body}}}'


class GroupHub:
    """Receives a group's deltas once for every client of it in this process.

    Merging and encoding per consumer cost the pool view (~115 KB of JSON per message)
    200 encodings one after another in one process, over a second from commit to the last
    client; once per process it is a few milliseconds. The hub checks the sequence numbers
    (a hole or a "resync" delta becomes a resync frame: each client gets a fresh snapshot)
    and sends at most one frame per window (LIVE_FLUSH_INTERVAL_S). Frames are contiguous:
    each one's `since` is the previous one's `seq`, starting at the group's seq when the
    hub joined, so a client that reads the seq for its snapshot after joining misses none.

    Redis restarting (nothing persisted) forgets the group's members and its sequence
    counter: the hub would never get a delta again, and later ones would look already seen.
    So a failing receive makes the hub join its group again once Redis answers, and that, or
    a sequence number going backwards, sends its clients a fresh snapshot (a restart frame).
    Redis can also lose the membership without a failing receive (FLUSHDB, the group's
    expiry, a restart between two receives): every LIVE_MEMBER_CHECK_S the hub checks it is
    still a member (one Redis call) and rejoins the same way when not.
    """

    _hubs: dict = {}  # (event loop, channel layer, group) -> hub

    def __init__(self, layer, group: str, key):
        self.layer, self.group, self.key = layer, group, key
        self.consumers: dict = {}  # consumer -> None (a dict keeps the joining order)
        self.channel = None
        self.changes: dict = {}
        self.received = self.sent = 0
        self.gap = self.restart = False
        self.last_flush = 0.0
        self.task = self.flush_task = self.watch_task = None
        self.delivering = asyncio.Lock()  # frames reach each client in order
        self.snapshots: dict = {}  # consumer class -> the task building its snapshot
        self.starting = asyncio.ensure_future(self._start())

    @classmethod
    async def join(cls, layer, group: str, consumer) -> GroupHub:
        key = (asyncio.get_running_loop(), layer, group)
        hub = cls._hubs.get(key)
        if hub is None:
            hub = cls._hubs[key] = cls(layer, group, key)
        hub.consumers[consumer] = None
        try:
            await asyncio.shield(hub.starting)
        except BaseException:
            await hub.leave(consumer)
            raise
        return hub

    async def leave(self, consumer) -> None:
        self.consumers.pop(consumer, None)
        if self.consumers:
            return
        if self._hubs.get(self.key) is self:
            del self._hubs[self.key]
        for task in (self.task, self.flush_task, self.watch_task):
            if task is not None:
                task.cancel()
        try:
            await asyncio.shield(self.starting)  # a half-done group_add is undone below
            await self.layer.group_discard(self.group, self.channel)
        except Exception as exc:  # noqa: BLE001 - the group entry expires on its own
            log.warning("live: leaving %s: %s", self.group, exc)

    async def snapshot(self, kind, build):
        """(seq, text) of a snapshot: one build at a time per consumer class, shared by every
        client that asks while it runs (200 dashboards reconnecting after a restart, or all
        the clients after a resync frame, cost one build instead of 200)."""
        task = self.snapshots.get(kind)
        if task is None:
            task = self.snapshots[kind] = asyncio.ensure_future(build())
            task.add_done_callback(lambda done: self.snapshots.pop(kind, None) if self.snapshots.get(kind) is done else None)
        return await asyncio.shield(task)

    async def _start(self):
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        # Read after joining: whatever was published before is in every snapshot read later.
        self.received = self.sent = await sync_to_async(live.current_seq)(self.group)
        self.task = asyncio.ensure_future(self._receive())
        if hasattr(self.layer, "_group_key") and hasattr(self.layer, "consistent_hash"):  # channels_redis
            self.watch_task = asyncio.ensure_future(self._watch())

    async def _watch(self):
        while True:
            await asyncio.sleep(member_check_interval())
            try:
                connection = self.layer.connection(self.layer.consistent_hash(self.group))
                member = await connection.zscore(self.layer._group_key(self.group), self.channel)
            except Exception:  # noqa: BLE001 - Redis away: the receive loop sees it too
                continue
            if member is None:
                log.warning("live: %s forgot this server's membership; joining again", self.group)
                await self._rejoin()

    async def _receive(self):
        while True:
            try:
                event = await self.layer.receive(self.channel)
            except Exception as exc:  # noqa: BLE001 - Redis away: join again once it is back
                log.warning("live: receiving %s: %s", self.group, exc)
                await self._rejoin()
                continue
            if event.get("type") != "live.delta":
                continue
            if event["seq"] <= self.received and await self._counter_went_back():
                await self._rejoin()
                continue
            self.add(event)

    async def _counter_went_back(self) -> bool:
        """A seq already seen: published just before the hub joined (harmless), or the
        counter started again (Redis restarted between two receives)."""
        try:
            return await sync_to_async(live.current_seq)(self.group) < self.received
        except Exception:  # noqa: BLE001 - Redis away again: the next receive fails and rejoins
            return False

    async def _rejoin(self):
        """Join the group again once Redis answers (a restarted Redis has forgotten the
        members; joining twice is harmless) and restart the chain from the group's current
        seq: every client gets a fresh snapshot."""
        while True:
            try:
                await self.layer.group_add(self.group, self.channel)
                seq = await sync_to_async(live.current_seq)(self.group)
                break
            except Exception as exc:  # noqa: BLE001 - still away
                log.warning("live: joining %s again: %s", self.group, exc)
                await asyncio.sleep(1.0)
        self.changes, self.gap, self.restart = {}, True, True
        self.received = seq
        self._schedule()

    def add(self, event: dict) -> None:
        seq = event["seq"]
        if seq <= self.received:
            return  # published before the hub joined (or rejoined): in every snapshot already
        if seq != self.received + 1:
            self.gap = True  # lost on the way (or out of order): resync at the flush
        self.received = seq
        if event["kind"] == "resync":
            self.gap = True
        else:
            live.merge(self.changes, event["kind"], event["payload"])
        self._schedule()

    def _schedule(self):
        if self.flush_task is None:
            wait = max(0.0, self.last_flush + flush_interval() - time.monotonic())
            self.flush_task = asyncio.ensure_future(self._flush_later(wait))

    async def _flush_later(self, wait: float):
        await asyncio.sleep(wait)
        self.flush_task = None
        self.last_flush = time.monotonic()
        frame = Frame(self.sent, self.received, None if self.gap else self.changes, self.restart)
        self.changes, self.gap, self.restart, self.sent = {}, False, False, self.received
        async with self.delivering:
            for consumer in list(self.consumers):
                try:
                    await consumer.hub_frame(frame)
                except Exception:  # noqa: BLE001 - one broken client must not stop the others
                    log.exception("live: sending %s to a client", self.group)


class LiveConsumer(AuthenticatedConsumer):
    group = ""
    # True where every client of the group gets the same snapshot (nothing depends on the
    # user): clients connecting at once, or resyncing after a hole, share one build.
    shared_snapshot = False

    def build_snapshot(self) -> dict:
        raise NotImplementedError

    @classmethod
    async def encode_json(cls, content):
        return dumps(content)

    async def on_authenticated(self):
        self.seq = 0  # what the client holds
        self.held = []  # frames held while a snapshot is built (None: not building one)
        self.hub = None
        self.snapshot_task = None
        self.snapshot_lock = asyncio.Lock()
        if not await self.find_target():
            return
        self.hub = await GroupHub.join(self.channel_layer, self.group, self)
        await self.send_snapshot(share=True)

    async def find_target(self) -> bool:
        return True

    async def __call__(self, scope, receive, send):
        # The consumer's own channel-layer receive failing (Redis away) ends it without a
        # disconnect(): leave the hub anyway, or it would keep sending to a dead client.
        try:
            await super().__call__(scope, receive, send)
        finally:
            hub, self.hub = getattr(self, "hub", None), None
            if hub is not None:
                await hub.leave(self)

    async def disconnect(self, code):
        if getattr(self, "snapshot_task", None):
            self.snapshot_task.cancel()
        hub, self.hub = getattr(self, "hub", None), None
        if hub is not None:
            await hub.leave(self)

    async def send_snapshot(self, share: bool = False):
        """The sequence number is read before the state: a delta racing with the snapshot is
        sent again afterwards, and applying a value twice is harmless. Frames that arrive
        while the snapshot is built are held and replayed after it. `share`: a build already
        running for another client of the group will do (a resync the browser asks for
        gets a build of its own, started after it asked)."""
        if self.held is None:
            self.held = []
        async with self.snapshot_lock:  # a resync asked for while a gap's snapshot is built waits
            if self.held is None:
                self.held = []
            if share and self.shared_snapshot and self.hub is not None:
                seq, text = await self.hub.snapshot(type(self), self._snapshot)
            else:
                seq, text = await self._snapshot()
            await self.send(text_data=text)
            self.seq = seq
            held, self.held = self.held, None
            for frame in held:
                await self.hub_frame(frame)

    async def _snapshot(self) -> tuple[int, str]:
        try:
            seq = await sync_to_async(live.current_seq)(self.group)
        except Exception as exc:  # noqa: BLE001 - Redis down: the snapshot still helps
            log.warning("live: cannot read the sequence of %s: %s", self.group, exc)
            seq = 0
        data = await database_sync_to_async(self.build_snapshot)()
        return seq, await self.encode_json({"type": "snapshot", "seq": seq, "data": data})

    async def hub_frame(self, frame: Frame):
        """A frame of the group's hub: sent on, held during a snapshot, or turned into one."""
        if self.held is not None:
            self.held.append(frame)
            return
        if frame.seq <= self.seq and not frame.restart:
            return  # already in the snapshot
        if frame.resync or frame.since > self.seq:
            # Built in a task of its own: the hub goes on serving the other clients meanwhile.
            self.held = []
            self.snapshot_task = asyncio.ensure_future(self._resync())
            return
        since, self.seq = self.seq, frame.seq
        await self.send(text_data=frame.text(since))

    async def _resync(self):
        try:
            await self.send_snapshot(share=True)
        except Exception:  # noqa: BLE001 - a task's failure would go unnoticed otherwise
            log.exception("live: snapshot of %s", self.group)

    async def receive_json(self, content, **kwargs):
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "resync":
            await self.send_snapshot()
        elif kind == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "message": f"unknown message type {kind!r}: resync or ping"})


class OverviewConsumer(LiveConsumer):
    shared_snapshot = True
    group = live.OVERVIEW

    def build_snapshot(self):
        return snapshots.overview()


class QueueConsumer(LiveConsumer):
    shared_snapshot = True
    group = live.QUEUE

    def build_snapshot(self):
        return snapshots.queue()


class PoolConsumer(LiveConsumer):
    shared_snapshot = True
    group = live.POOL

    def build_snapshot(self):
        return snapshots.pool()


class TopologyConsumer(LiveConsumer):
    """The topology page: host colour values and link states of every fabric (a page keeps
    the ids it draws and ignores the others)."""
    group = TOPOLOGY

    def build_snapshot(self):
        return snapshots.topology()


class HostConsumer(LiveConsumer):
    shared_snapshot = True

    async def find_target(self) -> bool:
        name = self.scope["url_route"]["kwargs"]["name"]
        self.host_id = await database_sync_to_async(
            lambda: Host.objects.filter(name=name).values_list("id", flat=True).first())()
        if self.host_id is None:
            await self.send_json({"type": "error", "message": f"no host named {name!r}"})
            await self.close(code=CLOSE_NOT_FOUND)
            return False
        self.group = live.host_group(self.host_id)
        return True

    def build_snapshot(self):
        return snapshots.host(self.host_id)
