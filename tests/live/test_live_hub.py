"""Many clients of one live view in one server process: each window's deltas are merged and
encoded once (core.live_consumers.GroupHub) and every client gets the same text; a client
joining while deltas flow still gets an unbroken chain; a hole costs one snapshot build for
all the clients. Real ASGI app, real Redis channel layer."""
import asyncio
import concurrent.futures
import time

import pytest

from core import live
from core import live_snapshots
from tests.live.conftest import ORIGIN, connect, run, session_cookie
from tests.live.test_live import receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("live_settings")]


async def open_view(path, cookie):
    view = connect(path, [ORIGIN, cookie])
    assert (await view.connect(timeout=5))[0]
    return view


def chain(snapshot_seq, messages):
    """The (since, seq) links of a client's deltas must follow on from its snapshot."""
    held = snapshot_seq
    for m in messages:
        assert m["type"] == "delta" and m["since"] == held, (held, m)
        held = m["seq"]
    return held


def test_every_client_of_a_view_gets_the_same_text_and_one_leaving_stops_nobody():
    cookie = session_cookie()

    async def go():
        views = [await open_view("/ws/live/queue/", cookie) for _ in range(3)]
        snapshots = [await v.receive_json_from(timeout=5) for v in views]
        await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"7": {"n": 1}})
        texts = [await v.receive_from(timeout=5) for v in views]
        await views[0].disconnect()
        await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"7": {"n": 2}})
        later = [await v.receive_json_from(timeout=5) for v in views[1:]]
        for v in views[1:]:
            await v.disconnect()
        # The last client gone, a new one is served afresh.
        again = await open_view("/ws/live/queue/", cookie)
        fresh = await again.receive_json_from(timeout=5)
        await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"7": {"n": 3}})
        third = await again.receive_json_from(timeout=5)
        await again.disconnect()
        return snapshots, texts, later, fresh, third

    snapshots, texts, later, fresh, third = run(go)
    seq = snapshots[0]["seq"]
    assert all(s["seq"] == seq for s in snapshots)
    assert texts[0] == texts[1] == texts[2]
    assert texts[0] == f'{{"type":"delta","since":{seq},"seq":{seq + 1},"changes":{{"jobs":{{"7":{{"n":1}}}}}}}}'
    assert [m["changes"] for m in later] == [{"jobs": {"7": {"n": 2}}}] * 2
    assert fresh["type"] == "snapshot" and fresh["seq"] == seq + 2
    assert third == {"type": "delta", "since": seq + 2, "seq": seq + 3, "changes": {"jobs": {"7": {"n": 3}}}}


def test_a_client_joining_while_deltas_flow_gets_an_unbroken_chain_to_the_last_value():
    cookie = session_cookie()
    n = 300

    async def go():
        first = await open_view("/ws/live/queue/", cookie)
        first_snapshot = await first.receive_json_from(timeout=5)
        start = first_snapshot["seq"]

        def burst():
            t0 = time.monotonic()
            for i in range(n):  # about a second, so the second client joins in the middle
                assert live.publish(live.QUEUE, "jobs", {str(i % 20): {"n": i}})
                time.sleep(max(0.0, t0 + (i + 1) / n - time.monotonic()))

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            task = asyncio.wrap_future(pool.submit(burst))
            await asyncio.sleep(0.4)
            second = await open_view("/ws/live/queue/", cookie)
            second_snapshot = await second.receive_json_from(timeout=5)
            await asyncio.wait_for(task, 30)
        final = start + n
        got = []
        for view in (first, second):
            got.append(await receive_until(view, lambda m: m.get("seq") == final, seconds=10))
            await view.disconnect()
        return start, final, first_snapshot, second_snapshot, got

    start, final, first_snapshot, second_snapshot, (first_msgs, second_msgs) = run(go)
    assert start < second_snapshot["seq"] < final, "the second client did not join during the burst"
    assert chain(first_snapshot["seq"], first_msgs) == final
    assert chain(second_snapshot["seq"], second_msgs) == final
    # Snapshot plus deltas give both clients the latest value of every key.
    latest = {str(k): {"n": max(i for i in range(n) if i % 20 == k)} for k in range(20)}
    for snapshot, msgs in ((first_snapshot, first_msgs), (second_snapshot, second_msgs)):
        state = dict(snapshot["data"]["jobs"])
        for m in msgs:
            state.update(m["changes"]["jobs"])
        assert state == latest


def test_a_hole_gives_every_client_a_fresh_snapshot_from_one_build(monkeypatch):
    cookie = session_cookie()
    builds = []
    original = live_snapshots.queue

    def counted():
        builds.append(time.monotonic())
        return original()

    monkeypatch.setattr(live_snapshots, "queue", counted)

    async def go():
        views = [await open_view("/ws/live/queue/", cookie) for _ in range(4)]
        first = [await v.receive_json_from(timeout=5) for v in views]
        connect_builds = len(builds)

        def lose_one():
            live.redis_client().incr(f"{live._prefix()}seq:{live.QUEUE}")  # as if dropped on the way
            live.publish(live.QUEUE, "jobs", {"1": None})

        await asyncio.to_thread(lose_one)
        after = [await v.receive_json_from(timeout=5) for v in views]
        await asyncio.to_thread(live.publish, live.QUEUE, "jobs", {"2": {"n": 2}})
        then = [await v.receive_json_from(timeout=5) for v in views]
        for v in views:
            await v.disconnect()
        return first, connect_builds, after, then

    first, connect_builds, after, then = run(go)
    seq = first[0]["seq"]
    assert [m["type"] for m in after] == ["snapshot"] * 4
    assert all(m["seq"] == seq + 2 for m in after)
    assert len(builds) == connect_builds + 1  # one build for the four clients
    assert all(m == {"type": "delta", "since": seq + 2, "seq": seq + 3, "changes": {"jobs": {"2": {"n": 2}}}}
               for m in then)
