"""Poll results written to the database: current values, samples, GPUs joining and
leaving, ECC events, IB throughput, adapter links, and host states over missed rounds."""
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.protocol import REPORT_SCHEMA, parse_report
from fabric.models import ChannelAdapter
from pool import ingest, tasks
from pool.models import Gpu, GpuSample, Host, HostEvent, HostSample
from pool.poller import Result
from pool.services import drain_host, synthetic_gpu_uuid, undrain_host
from tests.pool.conftest import build_cluster

pytestmark = pytest.mark.django_db


def host_ids(fabric=None):
    qs = Host.objects.filter(fabric=fabric) if fabric else Host.objects.all()
    return list(qs.order_by("name").values_list("id", flat=True))


def events(host, kind=None):
    """What polling said about the host (registration events left out unless asked for)."""
    qs = HostEvent.objects.filter(host=host).order_by("id")
    qs = qs.filter(kind=kind) if kind else qs.exclude(kind="registered")
    return list(qs.values_list("kind", "message"))


def gpu(index, uuid=None, **values):
    return {"index": index, "uuid": uuid or f"GPU-real-{index}", "model": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
            "memory_used_mib": 100 * index, "utilization_pct": 10.0 * index, "temperature_c": 40 + index, "power_w": 100.0 + index,
            "power_limit_w": 700.0, "ecc_corrected": 0, "ecc_uncorrected": 0, "compute_capability": "9.0", "numa_node": index // 4,
            "pci_bus_id": f"00000000:{index + 16:02X}:00.0", "nearest_hca": "mlx5_0", **values}


def port(device="mlx5_0", guid="", tx=0, rx=0, **values):
    return {"device": device, "port": 1, "node_guid": guid, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400,
            "link_layer": "InfiniBand", "counters": {"port_xmit_data_bytes": tx, "port_rcv_data_bytes": rx}, **values}


def ok(host, gpus=(), ports=(), at=None, **extra):
    at = at or time.time()
    report = parse_report({"schema": REPORT_SCHEMA, "host": host.name, "agent_version": "1.2.3", "time": at,
                           "cpu": {"percent": 12.5, "count": 64, "load1": 3.0}, "memory": {"total_mib": 1000, "used_mib": 250},
                           "gpus": list(gpus), "ib_ports": list(ports), **extra})
    return Result(host.pk, host.name, report=report, received_at=at)


def error(host, kind="timeout", message="no data for 0.5 s"):
    return Result(host.pk, host.name, error=kind, message=message, received_at=time.time())


# --- through the simulator ---------------------------------------------------------------


def test_first_poll_brings_a_cluster_up_with_current_values_and_samples(cluster, simulator):
    stats = tasks.poll_hosts(host_ids(cluster))
    assert (stats.hosts_ok, stats.hosts_error, stats.gpu_samples, stats.host_samples) == (4, 0, 32, 4)
    assert set(Host.objects.values_list("state", flat=True)) == {"up"}
    host = Host.objects.get(name="gpu0001")
    assert host.agent_version == "0.1.0+sim" and host.last_error == "" and host.missed_rounds == 0
    assert host.cpu_count == 112 and host.memory_total_mib == 2063731
    assert events(host, "state_changed") == [("state_changed", "new → up: first report")]

    # GPU rows made by build_fattree keep their ids and now carry what the agent reports
    assert Gpu.objects.count() == 32 and GpuSample.objects.count() == 32 and HostSample.objects.count() == 4
    row = Gpu.objects.get(host=host, index=3)
    assert (row.uuid, row.model, row.compute_capability, row.fp64_class) == (
        synthetic_gpu_uuid("gpu0001", 3), "NVIDIA H100 80GB HBM3", "9.0", "high")
    assert row.numa_node is not None and row.pci_bus_id and row.power_limit_w == 700.0
    assert row.temperature_c is not None and row.power_w > 0 and row.updated_at is not None
    sample = GpuSample.objects.get(gpu=row)
    assert (sample.utilization, sample.temperature_c, sample.power_w) == (row.utilization, row.temperature_c, row.power_w)


def test_a_second_round_appends_samples_and_measures_ib_throughput(cluster, simulator):
    ids = host_ids(cluster)
    tasks.poll_hosts(ids)
    host = Host.objects.get(name="gpu0002")
    assert host.ib_tx_bytes_per_s is None  # one reading: no rate yet
    time.sleep(0.2)
    tasks.poll_hosts(ids)
    host.refresh_from_db()
    assert GpuSample.objects.count() == 64 and HostSample.objects.count() == 8
    assert host.ib_tx_bytes_per_s is not None and host.ib_tx_bytes_per_s >= 0
    assert host.ib_ports[0]["device"] == "mlx5_0" and "tx_bytes_per_s" in host.ib_ports[0]


def test_faults_become_errors_kept_with_their_reason_and_the_round_goes_on(cluster, simulator):
    simulator.fault("gpu0002", "garbage", body="invalid_field")
    simulator.fault("gpu0003", "hang")
    simulator.fault("gpu0004", "oversized", mb=5)
    stats = tasks.poll_hosts(host_ids(cluster))
    assert (stats.hosts_ok, stats.hosts_error) == (1, 3)
    errors = dict(Host.objects.values_list("name", "last_error"))
    assert errors == {
        "gpu0001": "",
        "gpu0002": "invalid: gpus[0].utilization_pct: must be ≤ 100, got 250",
        "gpu0003": "timeout: no data for 0.5 s",
        "gpu0004": "oversized: body over the 4194304-byte limit; stopped reading",
    }
    assert GpuSample.objects.filter(gpu__host__name="gpu0001").count() == 8
    assert not GpuSample.objects.exclude(gpu__host__name="gpu0001").exists()
    bad = Host.objects.get(name="gpu0002")
    assert bad.missed_rounds == 1 and bad.last_error_at is not None and bad.state == "new"
    assert events(bad) == [("report_error", "no report: invalid: gpus[0].utilization_pct: must be ≤ 100, got 250")]


def test_a_wrong_secret_is_a_401_kept_on_the_host(cluster, simulator, settings):
    settings.AGENT_TOKEN_SECRET = "not-the-agents-secret"
    tasks.poll_hosts(host_ids(cluster))
    host = Host.objects.get(name="gpu0001")
    assert host.last_error == "http: HTTP 401 Unauthorized: missing or wrong bearer token"
    assert not GpuSample.objects.exists()


def test_stale_then_unreachable_then_up_again_with_events(cluster, simulator):
    ids = host_ids(cluster)
    tasks.poll_hosts(ids)
    simulator.fault("gpu0001", "down")
    seen = []
    for _ in range(5):
        tasks.poll_hosts(ids)
        host = Host.objects.get(name="gpu0001")
        seen.append((host.state, host.missed_rounds))
    assert seen == [("up", 1), ("stale", 2), ("stale", 3), ("unreachable", 4), ("unreachable", 5)]
    assert host.last_error == "disconnected: the agent closed the connection without an answer"
    simulator.fault("gpu0001", "clear")
    tasks.poll_hosts(ids)
    host.refresh_from_db()
    assert (host.state, host.missed_rounds, host.last_error, host.last_error_at) == ("up", 0, "", None)
    assert events(host) == [
        ("state_changed", "new → up: first report"),
        ("report_error", "no report: disconnected: the agent closed the connection without an answer"),
        ("state_changed", "up → stale: after 2 missed poll rounds (disconnected)"),
        ("state_changed", "stale → unreachable: after 4 missed poll rounds (disconnected)"),
        ("state_changed", "unreachable → up: reports again after 5 missed poll rounds"),
    ]
    # the other hosts never noticed
    assert set(Host.objects.exclude(pk=host.pk).values_list("state", flat=True)) == {"up"}


def test_ecc_errors_from_the_simulator_are_events(cluster, simulator):
    ids = host_ids(cluster)
    tasks.poll_hosts(ids)
    simulator.fault("gpu0003", "ecc", gpu=5, count=2)
    tasks.poll_hosts(ids)
    tasks.poll_hosts(ids)  # same counters: no new event
    host = Host.objects.get(name="gpu0003")
    [(kind, message)] = events(host, "ecc")
    assert message == f"gpu5 ({synthetic_gpu_uuid('gpu0003', 5)}): 2 new uncorrected ECC errors (2 since the driver loaded)"
    assert HostEvent.objects.get(host=host, kind="ecc").severity == "error"
    assert Gpu.objects.get(host=host, index=5).ecc_uncorrected == 2


def test_a_chunk_costs_the_same_few_statements_whatever_its_size(db, poll_settings, hosts_simulator):
    build_cluster("small", leaves=1, hosts_per_leaf=2)
    small = host_ids()
    build_cluster("big", leaves=4, hosts_per_leaf=4)
    big = [pk for pk in host_ids() if pk not in small]
    sim = hosts_simulator("\n".join(Host.objects.values_list("name", flat=True)))
    for host in Host.objects.all():
        host.agent_url = sim.url(host.name)
        host.save()
    tasks.poll_hosts(small), tasks.poll_hosts(big)  # first rounds adopt the GPUs
    counts = []
    for ids in (small, big):
        with CaptureQueriesContext(connection) as queries:
            tasks.poll_hosts(ids)
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 24, counts


# --- hand-made results -----------------------------------------------------------------


def test_placeholders_take_the_real_uuids_by_index(cluster):
    host = Host.objects.get(name="gpu0001")
    before = dict(Gpu.objects.filter(host=host).values_list("index", "id"))
    ingest.apply_results([ok(host, [gpu(i) for i in range(8)])])
    after = {row.index: row for row in Gpu.objects.filter(host=host)}
    assert {i: g.id for i, g in after.items()} == before
    assert [after[i].uuid for i in range(8)] == [f"GPU-real-{i}" for i in range(8)]
    assert (after[5].utilization, after[5].memory_used_mib, after[5].numa_node) == (50.0, 500, 1)
    assert events(host, "gpu_added") == [("gpu_added", "8 GPUs reported for the first time (NVIDIA H100 80GB HBM3)")]


def test_gpus_of_a_host_without_rows_are_created_and_join_its_pool(db):
    host = Host.objects.create(name="lonely", agent_url="http://lonely:9400")
    stats = ingest.apply_results([ok(host, [gpu(0, model="Tesla T4"), gpu(1, model="Tesla T4")])])
    assert stats.gpus_created == 2
    rows = list(Gpu.objects.filter(host=host).values_list("index", "uuid", "model", "fp64_class", "present"))
    assert rows == [(0, "GPU-real-0", "Tesla T4", "low", True), (1, "GPU-real-1", "Tesla T4", "low", True)]
    assert GpuSample.objects.filter(gpu__host=host).count() == 2


def test_gpus_missing_from_the_report_are_no_longer_present(cluster):
    host = Host.objects.get(name="gpu0002")
    ingest.apply_results([ok(host, [gpu(i) for i in range(8)])])
    ingest.apply_results([ok(host, [gpu(i) for i in range(6)])])  # gpu6 and gpu7 fell off the bus
    present = dict(Gpu.objects.filter(host=host).values_list("index", "present"))
    assert [i for i, p in present.items() if not p] == [6, 7]
    assert events(host, "gpu_missing") == [("gpu_missing", "not in the report, no longer offered: gpu6, gpu7")]
    ingest.apply_results([ok(host, [gpu(i) for i in range(8)])])
    assert Gpu.objects.filter(host=host, present=True).count() == 8
    assert ("gpu_added", "gpu7 (GPU-real-7) is reported again") in events(host, "gpu_added")


def test_a_swapped_gpu_and_a_new_index_order(cluster):
    host = Host.objects.get(name="gpu0003")
    ingest.apply_results([ok(host, [gpu(i) for i in range(8)])])
    ids = dict(Gpu.objects.filter(host=host).values_list("uuid", "id"))
    reported = [gpu(i) for i in range(8)]
    reported[2] = gpu(2, uuid="GPU-new-board")
    reported[0], reported[1] = gpu(1, uuid="GPU-real-0"), gpu(0, uuid="GPU-real-1")  # indexes swapped
    ingest.apply_results([ok(host, reported)])
    rows = dict(Gpu.objects.filter(host=host).values_list("uuid", "index"))
    assert (rows["GPU-real-0"], rows["GPU-real-1"], rows["GPU-new-board"]) == (1, 0, 2)
    assert Gpu.objects.get(uuid="GPU-real-0").id == ids["GPU-real-0"]  # same GPU, same row
    assert "GPU-real-2" not in rows
    messages = [m for _, m in events(host, "gpu_changed")]
    assert "GPU replaced: gpu2: GPU-real-2 → GPU-new-board" in messages
    assert "GPU index 0 → 1 (same UUID)" in messages


def test_ib_throughput_from_counter_deltas_and_resets(cluster):
    host = Host.objects.get(name="gpu0001")
    t0 = time.time() - 30
    ingest.apply_results([ok(host, ports=[port(tx=1_000_000_000, rx=0)], at=t0)])
    ingest.apply_results([ok(host, ports=[port(tx=3_000_000_000, rx=500_000_000)], at=t0 + 10)])
    host.refresh_from_db()
    assert (host.ib_tx_bytes_per_s, host.ib_rx_bytes_per_s) == (200_000_000.0, 50_000_000.0)
    assert host.ib_ports[0]["tx_bytes_per_s"] == 200_000_000.0
    sample = HostSample.objects.filter(host=host).latest("t")
    assert (sample.ib_tx_bytes_per_s, sample.cpu_percent, sample.memory_used_mib) == (200_000_000.0, 12.5, 250)
    ingest.apply_results([ok(host, ports=[port(tx=1000, rx=1000)], at=t0 + 20)])  # the host rebooted
    host.refresh_from_db()
    assert host.ib_tx_bytes_per_s is None
    ingest.apply_results([ok(host, ports=[port(tx=11000, rx=1000)], at=t0 + 30)])
    host.refresh_from_db()
    assert host.ib_tx_bytes_per_s == 1000.0


def test_reported_node_guids_repair_the_adapter_link(cluster):
    gpu1, gpu2 = Host.objects.get(name="gpu0001"), Host.objects.get(name="gpu0002")
    adapter = gpu1.adapters.get()
    gpu1.adapters.clear()
    gpu2.adapters.add(adapter)  # wrongly linked
    ingest.apply_results([ok(gpu1, ports=[port(guid="0x" + adapter.guid)])])
    assert list(gpu1.adapters.all()) == [adapter]
    assert adapter not in gpu2.adapters.all()
    assert events(gpu1, "adapter_linked") == [
        ("adapter_linked", f"adapter gpu0001 mlx5_0 (0x{adapter.guid}) linked: the agent reports its node GUID, moved from gpu0002")]
    # confirmed links make no more events; sysfs-style GUIDs are understood too
    colon = ":".join(adapter.guid[i:i + 4] for i in range(0, 16, 4))
    ingest.apply_results([ok(gpu1, ports=[port(guid=colon)])])
    assert len(events(gpu1, "adapter_linked")) == 1


def test_a_reported_guid_the_fabric_does_not_know_changes_nothing(cluster):
    host = Host.objects.get(name="gpu0001")
    adapters = list(host.adapters.all())
    ingest.apply_results([ok(host, ports=[port(guid="0xdeadbeef00000001")])])
    assert list(host.adapters.all()) == adapters
    assert ChannelAdapter.objects.filter(guid="deadbeef00000001").count() == 0


def test_the_same_error_is_one_event_a_new_reason_another(cluster):
    host = Host.objects.get(name="gpu0004")
    ingest.apply_results([error(host)])
    ingest.apply_results([error(host)])
    ingest.apply_results([error(host, "refused", "connection refused by gpu0004:9400")])
    assert [m for _, m in events(host, "report_error")] == [
        "no report: timeout: no data for 0.5 s", "no report: refused: connection refused by gpu0004:9400"]
    host.refresh_from_db()
    assert host.missed_rounds == 3 and host.last_error == "refused: connection refused by gpu0004:9400"


def test_a_draining_host_keeps_its_state_but_its_telemetry_is_recorded(cluster):
    host = Host.objects.get(name="gpu0001")
    ingest.apply_results([ok(host, [gpu(0)])])
    assert drain_host(host, actor="alice", reason="bad fan") is True
    assert drain_host(host, actor="alice") is False  # already draining
    for _ in range(6):
        ingest.apply_results([error(host)])
    host.refresh_from_db()
    assert (host.state, host.missed_rounds) == ("draining", 6)
    ingest.apply_results([ok(host, [gpu(0, utilization_pct=77.0)])])
    host.refresh_from_db()
    assert host.state == "draining" and not host.offers_gpus
    assert Gpu.objects.get(host=host, index=0).utilization == 77.0
    assert undrain_host(host, actor="bob") is True
    host.refresh_from_db()
    assert host.state == "up" and host.offers_gpus
    assert [(e.kind, e.actor, e.message) for e in HostEvent.objects.filter(host=host, kind__in=["drained", "undrained"]).order_by("id")] == [
        ("drained", "alice", "drained by alice (was up): bad fan"), ("undrained", "bob", "undrained by bob: draining → up")]


def test_undraining_a_host_that_stopped_reporting_makes_it_unreachable(cluster, settings):
    host = Host.objects.get(name="gpu0002")
    ingest.apply_results([ok(host)])
    drain_host(host, actor="alice")
    for _ in range(settings.UNREACHABLE_AFTER):
        ingest.apply_results([error(host)])
    undrain_host(host, actor="alice")
    host.refresh_from_db()
    assert host.state == "unreachable" and not host.offers_gpus


def test_a_host_deleted_while_polled_is_skipped(cluster):
    host = Host.objects.get(name="gpu0001")
    other = Host.objects.get(name="gpu0002")
    result = ok(host)
    Host.objects.filter(pk=host.pk).delete()
    stats = ingest.apply_results([result, ok(other)])
    assert (stats.hosts_ok, stats.hosts_error) == (1, 0)


def test_exporter_hosts_report_telemetry_but_run_no_work(db):
    host = Host.objects.create(name="t4-node", agent_kind=Host.AgentKind.DCGM, agent_url="http://t4-node:9400/metrics")
    ingest.apply_results([ok(host, [gpu(0, model="Tesla T4")])])
    host.refresh_from_db()
    assert host.state == "up" and not host.can_run_work and not host.offers_gpus
    assert Gpu.objects.get(host=host).fp64_class == "low"
