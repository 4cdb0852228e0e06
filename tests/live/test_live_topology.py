"""The topology page's live group ("live.topology") over real websockets, the real ASGI app
and the real Redis channel layer: who may connect, the snapshot (host colour values and link
states keyed as the page's data), a delta after a poll chunk, a cycle's tenant colours, and a
link health check's link states."""
import pytest
from asgiref.sync import sync_to_async
from celery.signals import task_postrun

from core import topology
from core.consumers import CLOSE_UNAUTHENTICATED
from fabric import tasks as fabric_tasks
from fabric.models import Fabric, Link
from pool import ingest
from pool.models import Gpu, Host
from scheduler import cycle, services
from scheduler.models import PoolPolicy, Tenant
from tests.live.conftest import ORIGIN, connect, run, session_cookie
from tests.live.test_live import receive_until
from tests.pool.test_ingest import gpu, ok
from tests.scheduler.conftest import build_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("live_settings")]
PATH = "/ws/live/topology/"


def test_topology_route_refuses_anonymous_and_foreign_origin():
    build_cluster(leaves=2, hosts_per_leaf=1, gpus=2)
    cookie = session_cookie()

    async def attempt(headers):
        communicator = connect(PATH, headers)
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
    assert allowed[0]


def test_snapshot_matches_the_page_then_a_poll_chunk_sends_only_its_hosts_new_colours():
    build_cluster(leaves=2, hosts_per_leaf=2, gpus=2)
    host = Host.objects.get(name="gpu0001")
    cookie = session_cookie()
    ingest.apply_results([ok(host, gpus=[gpu(0, utilization_pct=10.0), gpu(1, utilization_pct=20.0)])])
    page = topology.topology_data(Fabric.objects.get(name="sched"))

    async def go():
        view = connect(PATH, [ORIGIN, cookie])
        assert (await view.connect(timeout=5))[0]
        snapshot = await view.receive_json_from(timeout=5)
        report = [gpu(0, utilization_pct=90.0), gpu(1, utilization_pct=100.0)]
        await sync_to_async(ingest.apply_results)([ok(host, gpus=report)])
        deltas = await receive_until(view, lambda m: str(host.pk) in m.get("changes", {}).get("hosts", {}))
        await view.disconnect()
        return snapshot, deltas

    snapshot, deltas = run(go)
    assert snapshot["type"] == "snapshot"
    hosts = snapshot["data"]["hosts"]
    # Keyed by the ids the page's data carries, with the values it drew.
    assert sorted(hosts) == sorted(str(pk) for pk in page["hosts"]["id"])
    i = page["hosts"]["id"].index(host.pk)
    assert hosts[str(host.pk)] == [page["hosts"]["state"][i], page["hosts"]["util"][i], page["hosts"]["busy"][i], None]
    assert hosts[str(host.pk)][1] == 15.0
    drawn = {str(k) for g in page["links"]["groups"] for k in g["link"]}
    assert set(snapshot["data"]["links"]) == drawn and set(snapshot["data"]["links"].values()) == {"up"}
    changed = {}
    for m in deltas:
        changed.update(m["changes"]["hosts"])
    assert changed[str(host.pk)] == ["up", 95.0, 2, None]
    assert set(changed) == {str(host.pk)}  # the other hosts did not change


def test_a_cycle_colours_the_hosts_of_its_proposal_by_tenant_and_a_health_check_sends_link_states():
    cluster = build_cluster(leaves=2, hosts_per_leaf=1, gpus=2)
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)
    tenant = Tenant.objects.create(name="physics")
    cookie = session_cookie()
    link = Link.objects.filter(kind=Link.Kind.SWITCH_SWITCH).order_by("key").first()

    async def go():
        view = connect(PATH, [ORIGIN, cookie])
        assert (await view.connect(timeout=5))[0]
        assert (await view.receive_json_from(timeout=5))["type"] == "snapshot"

        def submit_and_plan():
            services.submit_job(None, tenant=tenant, pool="main", gpus=2, command=["train"])
            cycle.run_cycle()

        await sync_to_async(submit_and_plan)()
        planned = await receive_until(view, lambda m: any(
            v and v[3] == "physics" for v in m.get("changes", {}).get("hosts", {}).values()))

        def health_check():
            Link.objects.filter(pk=link.pk).update(state=Link.State.DOWN, state_reason="port went down")
            # What Celery sends after fabric.tasks.check_link_health ran in a worker.
            task_postrun.send(sender=fabric_tasks.check_link_health, task_id="t1", task=fabric_tasks.check_link_health,
                              args=(), kwargs={}, retval={}, state="SUCCESS")

        await sync_to_async(health_check)()
        down = await receive_until(view, lambda m: str(link.pk) in m.get("changes", {}).get("links", {}))
        await view.disconnect()
        return planned, down

    planned, down = run(go)
    tenants = {k: v[3] for m in planned for k, v in m["changes"]["hosts"].items()}
    held = set(Gpu.objects.filter(placement_gpus__active=True).values_list("host_id", flat=True))
    assert {k for k, t in tenants.items() if t == "physics"} == {str(h) for h in held}
    assert down[-1]["changes"]["links"] == {str(link.pk): "down"}
