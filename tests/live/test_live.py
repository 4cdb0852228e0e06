"""The live views over real websockets, the real ASGI app and the real Redis channel layer:
who may connect, snapshot first then deltas, what polls, cycles and decisions publish,
coalescing under a burst, resync, and publishing while Redis is unreachable."""
import asyncio
import concurrent.futures
import time

import pytest
from asgiref.sync import sync_to_async

from core import live
from core.consumers import CLOSE_UNAUTHENTICATED
from core.live_consumers import CLOSE_NOT_FOUND
from fabric import fattree
from fabric.importer import import_topology
from pool import ingest
from pool.models import Gpu, Host
from scheduler import cycle, services
from scheduler.models import Job, Placement, PoolPolicy, Tenant
from tests.live.conftest import ORIGIN, connect, run, session_cookie
from tests.pool.test_ingest import gpu, ok
from tests.scheduler.conftest import build_cluster, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("live_settings")]

ROUTES = ["/ws/live/overview/", "/ws/live/queue/", "/ws/live/pool/", "/ws/live/host/gpu0001/"]


def small_cluster():
    return build_cluster(leaves=2, hosts_per_leaf=1, gpus=2)


async def receive_all(communicator, seconds):
    """Every message that arrives within `seconds` (a receive that times out would cancel the
    consumer, so this waits with receive_nothing, which does not)."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        if not await communicator.receive_nothing(timeout=0.02, interval=0.005):
            out.append(await communicator.receive_json_from())
    return out


async def receive_until(communicator, predicate, seconds=3.0):
    """Messages up to the first that satisfies `predicate` (fails if none in time)."""
    seen, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        if await communicator.receive_nothing(timeout=0.02, interval=0.005):
            continue
        seen.append(await communicator.receive_json_from())
        if predicate(seen[-1]):
            return seen
    raise AssertionError(f"no matching message in {seconds} s; got {seen}")


@pytest.mark.parametrize("path", ROUTES)
def test_every_live_route_refuses_anonymous_and_foreign_origin(path):
    small_cluster()
    cookie = session_cookie()

    async def attempt(headers):
        communicator = connect(path, headers)
        connected, code = await communicator.connect(timeout=5)
        if connected:
            await communicator.disconnect()
        return connected, code

    async def go():
        return [await attempt([ORIGIN]), await attempt([(b"origin", b"http://evil.example"), cookie]),
                await attempt([ORIGIN, cookie])]

    anonymous, foreign, allowed = run(go)
    assert anonymous == (False, CLOSE_UNAUTHENTICATED)
    assert not foreign[0] and foreign[1] != CLOSE_UNAUTHENTICATED  # refused at the origin check
    assert allowed[0]  # the same session from the right origin gets in


def test_unknown_host_is_closed_with_the_reason():
    cookie = session_cookie()

    async def go():
        communicator = connect("/ws/live/host/no-such-host/", [ORIGIN, cookie])
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        message = await communicator.receive_json_from(timeout=5)
        closed = await communicator.receive_output(timeout=5)
        return message, closed

    message, closed = run(go)
    assert message == {"type": "error", "message": "no host named 'no-such-host'"}
    assert closed == {"type": "websocket.close", "code": CLOSE_NOT_FOUND}


def test_poll_ingest_sends_snapshot_first_then_only_the_changed_gpus_to_pool_and_host_views():
    small_cluster()
    host = Host.objects.get(name="gpu0001")
    gpu_ids = list(Gpu.objects.filter(host=host).order_by("index").values_list("id", flat=True))
    cookie = session_cookie()
    report = [gpu(0, utilization_pct=10.0, memory_used_mib=100), gpu(1, utilization_pct=20.0, memory_used_mib=100)]
    ingest.apply_results([ok(host, gpus=report)])  # the values the views start from

    async def go():
        pool_view = connect("/ws/live/pool/", [ORIGIN, cookie])
        host_view = connect("/ws/live/host/gpu0001/", [ORIGIN, cookie])
        assert (await pool_view.connect(timeout=5))[0] and (await host_view.connect(timeout=5))[0]
        pool_snapshot = await pool_view.receive_json_from(timeout=5)
        host_snapshot = await host_view.receive_json_from(timeout=5)
        # GPU 0 moves by 1 % (below the threshold: not sent), GPU 1 by 60 %.
        changed = [gpu(0, utilization_pct=11.0, memory_used_mib=100), gpu(1, utilization_pct=80.0, memory_used_mib=100)]
        await sync_to_async(ingest.apply_results)([ok(host, gpus=changed)])
        pool_deltas = await receive_until(pool_view, lambda m: "gpus" in m.get("changes", {}))
        host_deltas = await receive_until(host_view, lambda m: "gpus" in m.get("changes", {}))
        await pool_view.disconnect()
        await host_view.disconnect()
        return pool_snapshot, host_snapshot, pool_deltas, host_deltas

    pool_snapshot, host_snapshot, pool_deltas, host_deltas = run(go)
    assert pool_snapshot["type"] == "snapshot"
    assert pool_snapshot["data"]["hosts"]["name"] == ["gpu0001", "gpu0002"]
    position = pool_snapshot["data"]["gpus"]["id"].index(gpu_ids[1])
    assert pool_snapshot["data"]["gpus"]["util"][position] == 20.0
    assert host_snapshot["data"]["host"]["name"] == "gpu0001"
    assert [g["util"] for g in host_snapshot["data"]["gpus"]] == [10.0, 20.0]
    for snapshot, deltas in ((pool_snapshot, pool_deltas), (host_snapshot, host_deltas)):
        assert all(m["type"] == "delta" for m in deltas)
        assert deltas[0]["since"] == snapshot["seq"]  # the chain starts at the snapshot
        assert deltas[-1]["changes"]["gpus"] == {str(gpu_ids[1]): [80.0, 100, 41.0]}


def test_a_cycle_and_a_decision_reach_queue_pool_and_overview_views():
    cluster = small_cluster()
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)
    tenant = Tenant.objects.create(name="physics")
    operator = make_user("alice", "operator")
    cookie = session_cookie()

    async def go():
        views = {name: connect(f"/ws/live/{name}/", [ORIGIN, cookie]) for name in ("queue", "pool", "overview")}
        for communicator in views.values():
            assert (await communicator.connect(timeout=5))[0]
            assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"

        def submit_and_plan():
            job = services.submit_job(None, tenant=tenant, pool="main", gpus=2, command=["train"])
            cycle.run_cycle()
            return job, Placement.objects.get(job=job, state=Placement.State.PROPOSED)

        job, placement = await sync_to_async(submit_and_plan)()
        proposed = await receive_until(views["queue"], lambda m: str(placement.pk) in m.get("changes", {}).get("proposals", {}))
        overview = await receive_until(views["overview"], lambda m: "last_cycle" in m.get("changes", {}).get("overview", {}))
        await sync_to_async(services.approve)(placement, operator, expected_version=placement.version)
        decided = await receive_until(views["queue"], lambda m: m.get("changes", {}).get("proposals", {}).get(str(placement.pk), 0) is None)
        busy = await receive_until(views["pool"], lambda m: "alloc" in m.get("changes", {}))
        for communicator in views.values():
            await communicator.disconnect()
        return job, placement, proposed, overview, decided, busy

    job, placement, proposed, overview, decided, busy = run(go)
    row = proposed[-1]["changes"]["proposals"][str(placement.pk)]
    assert (row["job"], row["gpus"], row["version"]) == (job.pk, 2, placement.version)
    assert overview[-1]["changes"]["overview"]["last_cycle"]["id"] is not None
    left_queue = {}
    for message in decided:
        left_queue.update(message["changes"].get("jobs", {}))
    assert left_queue[str(job.pk)] is None  # approved: no longer in the queue
    held = {g: job.pk for g in map(str, services.gpu_ids_of(placement))}
    assert busy[-1]["changes"]["alloc"] == held


def test_a_fabric_import_sends_the_pool_view_a_fresh_snapshot_with_the_new_hosts():
    cookie = session_cookie()

    async def go():
        view = connect("/ws/live/pool/", [ORIGIN, cookie])
        assert (await view.connect(timeout=5))[0]
        before = await view.receive_json_from(timeout=5)

        def grow():
            tree = fattree.build(spines=1, leaves=1, hosts_per_leaf=2, gpus_per_host=1, speed="EDR")
            import_topology(tree.topology, "grown", source_name="test")

        await sync_to_async(grow)()
        after = await receive_until(view, lambda m: m["type"] == "snapshot")
        await view.disconnect()
        return before, after[-1]

    before, after = run(go)
    assert before["data"]["hosts"]["name"] == []
    assert after["data"]["hosts"]["name"] == ["gpu0001", "gpu0002"] and after["seq"] > before["seq"]


def test_a_burst_of_500_publishes_reaches_a_client_as_a_few_merged_messages():
    cookie = session_cookie()
    n = 500

    async def go():
        view = connect("/ws/live/queue/", [ORIGIN, cookie])
        assert (await view.connect(timeout=5))[0]
        snapshot = await view.receive_json_from(timeout=5)

        def burst():
            t0 = time.monotonic()
            for i in range(n):  # spread over about a second, as a busy cluster would
                assert live.publish(live.QUEUE, "jobs", {str(i % 50): {"n": i}})
                time.sleep(max(0.0, t0 + (i + 1) / n - time.monotonic()))
            return time.monotonic() - t0

        # From a thread of its own, as a worker process would: not on the consumer's event loop
        # (which goes on running while the burst lasts: it is awaited, not waited for).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            task = asyncio.wrap_future(pool.submit(burst))
            messages = await receive_all(view, 1.2)
            seconds = await asyncio.wait_for(task, 30)
        final = snapshot["seq"] + n
        if not messages or messages[-1]["seq"] != final:  # then the last window's message
            messages += await receive_until(view, lambda m: m.get("seq") == final, seconds=10)
        messages += await receive_all(view, 0.3)  # nothing more
        await view.disconnect()
        return snapshot, messages, seconds

    snapshot, messages, seconds = run(go)
    assert all(m["type"] == "delta" for m in messages)
    # At most one message per 250 ms window while the burst lasts, plus the last window.
    assert 1 <= len(messages) <= seconds / 0.25 + 2, (len(messages), seconds)
    # The chain has no hole and ends at the last publish; the merged content is the latest value of each key.
    seq = snapshot["seq"]
    state = {}
    for m in messages:
        assert m["since"] == seq
        seq = m["seq"]
        state.update(m["changes"]["jobs"])
    assert seq == snapshot["seq"] + n
    assert state == {str(k): {"n": max(i for i in range(n) if i % 50 == k)} for k in range(50)}
    print(f"{n} publishes in {seconds:.2f} s -> {len(messages)} messages", [(m["since"], m["seq"]) for m in messages])


def test_lost_messages_turn_into_a_fresh_snapshot_and_resync_answers_with_one():
    small_cluster()
    cookie = session_cookie()
    tenant = Tenant.objects.create(name="physics")

    async def go():
        view = connect("/ws/live/queue/", [ORIGIN, cookie])
        assert (await view.connect(timeout=5))[0]
        first = await view.receive_json_from(timeout=5)

        def job_behind_the_views_back():
            # Written without a signal, and the delta saying so "lost": the seq jumps by one.
            job = Job.objects.create(tenant=tenant, pool=Host.objects.first().pool, gpus=1, command=["x"])
            live.redis_client().incr(f"{live._prefix()}seq:{live.QUEUE}")
            live.publish(live.QUEUE, "jobs", {"0": None})
            return job

        job = await sync_to_async(job_behind_the_views_back)()
        after_gap = await view.receive_json_from(timeout=5)
        await sync_to_async(Job.objects.filter(pk=job.pk).update)(priority=7)
        await view.send_json_to({"type": "resync"})
        resynced = await view.receive_json_from(timeout=5)
        await view.send_json_to({"type": "nonsense"})
        error = await view.receive_json_from(timeout=5)
        await view.disconnect()
        return job, first, after_gap, resynced, error

    job, first, after_gap, resynced, error = run(go)
    assert first["data"] == {"jobs": {}, "proposals": {}}
    assert after_gap["type"] == "snapshot" and after_gap["seq"] == first["seq"] + 2
    assert after_gap["data"]["jobs"][str(job.pk)]["priority"] == 0
    assert resynced["type"] == "snapshot" and resynced["data"]["jobs"][str(job.pk)]["priority"] == 7
    assert error["type"] == "error" and "resync" in error["message"]


def test_publishing_with_redis_unreachable_never_breaks_a_poll_round(live_settings, caplog):
    small_cluster()
    host = Host.objects.get(name="gpu0001")
    live_settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    live_settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                                "CONFIG": {"hosts": [live_settings.REDIS_URL]}}}
    failed = live.stats["failed"]
    assert live.publish(live.POOL, "gpus", {"1": [1, 2, 3]}) is False
    t0 = time.monotonic()
    stats = ingest.apply_results([ok(host, gpus=[gpu(0, utilization_pct=55.0)])])
    assert time.monotonic() - t0 < 3
    assert stats.hosts_ok == 1
    assert Gpu.objects.get(host=host, index=0).utilization == 55.0  # the poll's work is committed
    assert live.stats["failed"] >= failed + 2
    assert "live update" in caplog.text
