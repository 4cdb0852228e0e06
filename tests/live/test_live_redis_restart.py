"""Redis restarting (nothing persisted) forgets the channel-layer group members and the
sequence counters. The server process's hub must join its group again and give its clients
a fresh snapshot, so a change made after Redis came back still reaches an open view.
Real ASGI app, real channel layer, a redis-server of this test that it stops and starts."""
import asyncio
import contextlib
import shutil
import socket
import subprocess
import time

import pytest
import redis

from core import live
from tests.live.conftest import ORIGIN, connect, run, session_cookie
from tests.live.test_live import receive_until

pytestmark = [pytest.mark.django_db(transaction=True)]


class PrivateRedis:
    """redis-server on a free port, saving nothing (a restart starts empty)."""

    def __init__(self, directory):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.directory, self.process = directory, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.process = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def private_redis(settings, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on this machine")
    server = PrivateRedis(tmp_path)
    server.start()
    settings.REDIS_URL = server.url  # before live_settings, which builds the channel layer on it
    yield server
    with contextlib.suppress(Exception):
        server.stop()


async def open_queue(cookie):
    view = connect("/ws/live/queue/", [ORIGIN, cookie])
    assert (await view.connect(timeout=5))[0]
    snapshot = await view.receive_json_from(timeout=5)
    assert snapshot["type"] == "snapshot"
    return view, snapshot


async def close(view):
    with contextlib.suppress(Exception):  # a consumer ended by Redis going away raises here
        await view.disconnect()


def test_a_change_made_after_redis_restarted_reaches_a_view_opened_before(private_redis, live_settings):
    cookie = session_cookie()

    async def go():
        before, _ = await open_queue(cookie)
        await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"1": {"n": 1}})
        first = await before.receive_json_from(timeout=5)
        private_redis.stop()
        await asyncio.sleep(0.5)  # the consumers and the hub see their receives fail
        private_redis.start()  # empty: no group members, every counter back at 0
        # The browser's reconnect: a new connection to the same server process.
        after, snapshot = await open_queue(cookie)
        await asyncio.sleep(1.5)  # the hub has joined again (it retries every second)
        assert await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"2": {"n": 2}})
        got = await receive_until(after, lambda m: m.get("changes", {}).get("jobs", {}).get("2")
                                  or m["type"] == "snapshot" and "2" in m["data"]["jobs"], seconds=10)
        await close(before)
        await close(after)
        return first, snapshot, got

    first, snapshot, got = run(go)
    assert first["changes"] == {"jobs": {"1": {"n": 1}}}
    assert snapshot["seq"] <= 1, "the counter was not reset: this test did not restart Redis"
    last = got[-1]
    assert (last.get("changes") or {}).get("jobs", {}).get("2") == {"n": 2} or last["data"]["jobs"]["2"] == {"n": 2}


def test_a_hub_that_redis_forgot_joins_again_and_its_clients_resync(live_settings):
    """Group members and the counter gone without any connection failing (as after FLUSHDB):
    the hub notices at its membership check, and its clients get a fresh snapshot, then deltas."""
    live_settings.LIVE_MEMBER_CHECK_S = 0.2
    cookie = session_cookie()

    async def go():
        view, snapshot = await open_queue(cookie)
        for n in range(3):
            await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"1": {"n": n}})
        held = await receive_until(view, lambda m: m.get("seq") == snapshot["seq"] + 3, seconds=5)

        def forget():
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            client = redis.Redis.from_url(live_settings.REDIS_URL)
            client.delete(layer._group_key(live.QUEUE), f"{live._prefix()}seq:{live.QUEUE}")

        await asyncio.to_thread(forget)
        fresh = await receive_until(view, lambda m: m["type"] == "snapshot", seconds=5)
        assert await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"2": {"n": 2}})
        delta = await view.receive_json_from(timeout=5)
        await view.disconnect()
        return snapshot, held, fresh[-1], delta

    snapshot, held, fresh, delta = run(go)
    assert held[-1]["changes"]["jobs"]["1"] == {"n": 2}
    assert fresh["seq"] == 0 and fresh["data"]["jobs"] == snapshot["data"]["jobs"]
    # The counter started again at 1: without the resync this delta would be "already seen".
    assert delta == {"type": "delta", "since": 0, "seq": 1, "changes": {"jobs": {"2": {"n": 2}}}}
