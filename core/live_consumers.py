"""Websocket consumers of the live views: login, role and origin are checked before
(AuthenticatedConsumer, config.asgi); then the consumer joins its view's group, sends the
snapshot and forwards deltas, coalesced (core.live explains the design).

Messages to the browser:
  {"type": "snapshot", "seq": N, "data": {...}}
  {"type": "delta", "since": M, "seq": N, "changes": {kind: {key: value}}}
      (apply only when `since` is the seq of what the client holds; otherwise send resync)
  {"type": "error", "message": "..."}
From the browser: {"type": "resync"} (a fresh snapshot), {"type": "ping"} (a pong).
"""
from __future__ import annotations

import asyncio
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


def flush_interval() -> float:
    return float(getattr(settings, "LIVE_FLUSH_INTERVAL_S", 0.25))


class LiveConsumer(AuthenticatedConsumer):
    group = ""

    def build_snapshot(self) -> dict:
        raise NotImplementedError

    async def on_authenticated(self):
        self.changes: dict = {}
        self.seq = 0  # what the client holds
        self.received = 0  # the latest seq received (merged into self.changes)
        self.gap = False
        self.last_flush = 0.0
        self.flush_task = None
        self.held = []  # deltas held while a snapshot is built (None: not building one)
        self.snapshot_lock = asyncio.Lock()
        if not await self.find_target():
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.send_snapshot()

    async def find_target(self) -> bool:
        return True

    async def disconnect(self, code):
        if getattr(self, "flush_task", None):
            self.flush_task.cancel()
        if self.group and getattr(self, "channel_name", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def send_snapshot(self):
        """The sequence number is read before the state: a delta racing with the snapshot is
        sent again afterwards, and applying a value twice is harmless. Deltas that arrive
        while the snapshot is built are held and replayed after it."""
        async with self.snapshot_lock:  # a resync asked for while a gap's snapshot is built waits
            await self._send_snapshot()

    async def _send_snapshot(self):
        if self.flush_task:
            self.flush_task.cancel()
            self.flush_task = None
        self.changes, self.gap, self.held = {}, False, []
        try:
            seq = await sync_to_async(live.current_seq)(self.group)
        except Exception as exc:  # noqa: BLE001 - Redis down: the snapshot still helps
            log.warning("live: cannot read the sequence of %s: %s", self.group, exc)
            seq = 0
        data = await database_sync_to_async(self.build_snapshot)()
        await self.send_json({"type": "snapshot", "seq": seq, "data": data})
        self.seq = self.received = seq
        held, self.held = self.held, None
        for event in held:
            await self.live_delta(event)

    async def live_delta(self, event):
        if self.held is not None:
            self.held.append(event)  # a snapshot is being built
            return
        seq = event["seq"]
        if seq <= self.received:
            return  # already in the snapshot
        if seq != self.received + 1:
            self.gap = True  # messages lost on the way (or out of order): resync at the flush
        self.received = seq
        if event["kind"] == "resync":
            self.gap = True
        else:
            live.merge(self.changes, event["kind"], event["payload"])
        if self.flush_task is None:
            wait = max(0.0, self.last_flush + flush_interval() - time.monotonic())
            self.flush_task = asyncio.ensure_future(self.flush_later(wait))

    async def flush_later(self, wait: float):
        await asyncio.sleep(wait)
        self.flush_task = None
        self.last_flush = time.monotonic()
        if self.gap:
            await self.send_snapshot()
            return
        changes, self.changes = self.changes, {}
        since, self.seq = self.seq, self.received
        await self.send_json({"type": "delta", "since": since, "seq": self.seq, "changes": changes})

    async def receive_json(self, content, **kwargs):
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "resync":
            await self.send_snapshot()
        elif kind == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "message": f"unknown message type {kind!r}: resync or ping"})


class OverviewConsumer(LiveConsumer):
    group = live.OVERVIEW

    def build_snapshot(self):
        return snapshots.overview()


class QueueConsumer(LiveConsumer):
    group = live.QUEUE

    def build_snapshot(self):
        return snapshots.queue()


class PoolConsumer(LiveConsumer):
    group = live.POOL

    def build_snapshot(self):
        return snapshots.pool()


class HostConsumer(LiveConsumer):
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
