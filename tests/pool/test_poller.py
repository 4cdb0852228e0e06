"""The poller against the agent simulator: every fault as the poller sees it, with the
reason an operator will read. No database: targets in, results out."""
import gzip
import time

import pytest
from aiohttp import web

from agent.protocol import MAX_REPORT_BYTES, derive_token
from pool import poller
from tests.conftest import read_sample
from tests.pool.conftest import RunningServer

SECRET = "poller-test-secret"
LIMITS = poller.Limits(connect_timeout=0.5, read_timeout=0.5, total_timeout=1.5, concurrency=16)


@pytest.fixture
def sim(hosts_simulator):
    return hosts_simulator("gpu0001\ngpu0002\ngpu0003\n", secret=SECRET, seed=3)


def target(sim, name, *, secret=SECRET, host_id=1):
    return poller.Target(host_id, name, sim.url(name), derive_token(secret, name))


def fetch_one(t, limits=LIMITS, **kwargs):
    [result] = poller.fetch_sync([t], limits, **kwargs)
    return result


def test_a_good_report_comes_back_validated(sim):
    result = fetch_one(target(sim, "gpu0001"))
    assert result.ok, result.reason
    assert result.report["host"] == "gpu0001"
    assert len(result.report["gpus"]) == 8
    assert result.report["ib_ports"][0]["node_guid"].startswith("0x")
    assert result.error == "" and result.received_at == pytest.approx(time.time(), abs=5)


def test_results_keep_the_order_of_the_targets_and_each_host_gets_its_own(sim):
    names = ["gpu0003", "gpu0001", "gpu0002"]
    results = poller.fetch_sync([target(sim, n, host_id=i) for i, n in enumerate(names)], LIMITS)
    assert [(r.host_id, r.name, r.report["host"]) for r in results] == [(0, "gpu0003", "gpu0003"), (1, "gpu0001", "gpu0001"),
                                                                       (2, "gpu0002", "gpu0002")]


def test_the_bearer_token_is_the_hosts_own(sim):
    wrong_secret = fetch_one(target(sim, "gpu0001", secret="another-secret"))
    assert (wrong_secret.error, wrong_secret.message) == ("http", "HTTP 401 Unauthorized: missing or wrong bearer token")
    # gpu0002's token does not open gpu0001
    borrowed = poller.Target(1, "gpu0001", sim.url("gpu0001"), derive_token(SECRET, "gpu0002"))
    assert fetch_one(borrowed).error == "http"
    no_token = poller.Target(1, "gpu0001", sim.url("gpu0001"), "")
    assert "401" in fetch_one(no_token).message


def test_a_down_host_is_reported_as_disconnected(sim):
    sim.fault("gpu0001", "down")
    result = fetch_one(target(sim, "gpu0001"))
    assert result.error == "disconnected"
    assert result.message == "the agent closed the connection without an answer"


def test_nothing_listening_is_refused():
    t = poller.Target(1, "gpu0001", "http://127.0.0.1:9", "token")  # discard port: nothing listens
    result = fetch_one(t)
    assert (result.error, result.message) == ("refused", "connection refused by 127.0.0.1:9")


def test_an_unresolvable_host_is_unreachable():
    result = fetch_one(poller.Target(1, "gpu0001", "http://no-such-host.invalid:9400", "token"))
    assert result.error == "unreachable"
    assert "no-such-host.invalid:9400" in result.message


def test_a_hanging_host_times_out_on_the_read_timeout(sim):
    sim.fault("gpu0001", "hang")
    started = time.monotonic()
    result = fetch_one(target(sim, "gpu0001"))
    assert time.monotonic() - started < 1.4
    assert (result.error, result.message) == ("timeout", "no data for 0.5 s")


def test_a_slow_host_within_the_timeout_is_fine_and_beyond_it_is_not(sim):
    sim.fault("gpu0001", "slow", delay_s=0.2)
    assert fetch_one(target(sim, "gpu0001")).ok
    sim.fault("gpu0001", "slow", delay_s=2.0)
    assert fetch_one(target(sim, "gpu0001")).error == "timeout"


def test_a_slow_loris_is_cut_by_the_total_time_per_request(sim):
    # a byte every 0.1 s never trips the 0.5 s read timeout: the 1.5 s total does
    sim.fault("gpu0001", "trickle", interval_s=0.1)
    started = time.monotonic()
    result = fetch_one(target(sim, "gpu0001"))
    assert 1.4 < time.monotonic() - started < 2.5
    assert (result.error, result.message) == ("timeout", "no complete report within 1.5 s")


@pytest.mark.parametrize("body, message", [
    ("truncated", "report: not JSON: "),
    ("binary", "report: not JSON: "),
    ("html", "report: not JSON: "),
    ("not_object", "report: expected a JSON object, got list"),
    ("wrong_schema", "schema: unsupported schema 'fabricpool.report/99'; this server reads fabricpool.report/1"),
    ("invalid_field", "gpus[0].utilization_pct: must be ≤ 100, got 250"),
])
def test_garbage_is_refused_with_the_path_of_the_problem(sim, body, message):
    sim.fault("gpu0001", "garbage", body=body)
    result = fetch_one(target(sim, "gpu0001"))
    assert result.error == "invalid"
    assert result.message.startswith(message)


@pytest.mark.parametrize("announced", [True, False])
def test_an_oversized_report_is_not_read_past_the_limit(sim, announced):
    sim.fault("gpu0001", "oversized", mb=8, content_length=announced)
    started = time.monotonic()
    result = fetch_one(target(sim, "gpu0001"))
    assert result.error == "oversized"
    if announced:
        assert result.message.endswith(f"over the {MAX_REPORT_BYTES}-byte limit; not read")
    else:
        assert result.message == f"body over the {MAX_REPORT_BYTES}-byte limit; stopped reading"
    assert time.monotonic() - started < 1.5


def test_a_small_limit_applies_to_normal_reports_too(sim):
    result = fetch_one(target(sim, "gpu0001"), poller.Limits(max_bytes=1000, connect_timeout=0.5, read_timeout=0.5))
    assert result.error == "oversized"


def test_ecc_errors_and_a_flapping_port_come_through_in_the_report(sim):
    sim.fault("gpu0001", "ecc", gpu=2, count=3, corrected=5)
    sim.fault("gpu0001", "flap_ib", port=0, period_s=60)
    report = fetch_one(target(sim, "gpu0001")).report
    gpu = report["gpus"][2]
    assert (gpu["ecc_uncorrected"], gpu["ecc_corrected"]) == (3, 5)
    assert report["ib_ports"][0]["state"] == "DOWN"


def test_a_report_for_another_host_is_refused(sim):
    # gpu0002's agent answering at gpu0001's address (a DNS or inventory mix-up)
    t = poller.Target(1, "gpu0001", sim.url("gpu0002"), derive_token(SECRET, "gpu0002"))
    result = fetch_one(t)
    assert (result.error, result.message) == ("wrong_host", "the report is from host 'gpu0002', not 'gpu0001'")


def test_one_bad_host_does_not_spoil_the_others(sim):
    sim.fault("gpu0002", "hang")
    sim.fault("gpu0003", "garbage")
    results = poller.fetch_sync([target(sim, n) for n in ("gpu0001", "gpu0002", "gpu0003")], LIMITS)
    assert [r.ok for r in results] == [True, False, False]
    assert [r.error for r in results] == ["", "timeout", "invalid"]


def test_the_batch_deadline_ends_whatever_is_still_running(sim):
    sim.fault("gpu0002", "trickle", interval_s=0.05)
    limits = poller.Limits(connect_timeout=0.5, read_timeout=0.5, total_timeout=30)
    started = time.monotonic()
    results = poller.fetch_sync([target(sim, "gpu0001"), target(sim, "gpu0002")], limits, deadline=0.8)
    assert time.monotonic() - started < 1.5
    assert results[0].ok
    assert (results[1].error, results[1].message) == ("timeout", "no report before the round's 0.8 s deadline")


def test_many_agents_at_once_with_few_connections(hosts_simulator):
    names = [f"gpu{i:04d}" for i in range(1, 201)]
    sim = hosts_simulator("\n".join(names), secret=SECRET)
    results = poller.fetch_sync([target(sim, n) for n in names], poller.Limits(concurrency=8, connect_timeout=2, read_timeout=2))
    assert all(r.ok for r in results), {r.reason for r in results if not r.ok}


# --- things the simulator does not do: a tiny server of our own ----------------------------


@pytest.fixture
def odd_server():
    async def handler(request):
        kind = request.match_info["kind"]
        if kind == "error500":
            return web.json_response({"error": "NVML not loaded", "path": ""}, status=500)
        if kind == "redirect":
            raise web.HTTPFound("http://example.org/")
        if kind == "dup_index":
            gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 0, "uuid": "GPU-b"}]
            return web.json_response({"schema": "fabricpool.report/1", "host": "h", "time": 1, "gpus": gpus})
        if kind == "dcgm":
            return web.Response(body=read_sample("dcgm-exporter_metrics-T4-ericsson.prom"), content_type="text/plain")
        if kind == "node":
            return web.Response(body=read_sample("node-exporter_e2e-output_infiniband.prom"),
                                content_type="text/plain")
        if kind == "gzip_bomb":  # 10 KB on the wire, 10 MB once inflated
            body = gzip.compress(b" " * 10_000_000)
            return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        if kind == "auth":  # echoes the Authorization header it got as the GPU model
            seen = request.headers.get("Authorization", "none").replace('"', "")
            return web.Response(text=f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-1",modelName="{seen}"}} 5\n')
        return web.Response(body=b"# HELP foo bar\nfoo 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{kind}/v1/report", handler)
    app.router.add_get("/{kind}", handler)
    server = RunningServer(app)
    yield server
    server.stop()


def test_an_agent_error_is_quoted(odd_server):
    result = fetch_one(poller.Target(1, "h", f"{odd_server.base}/error500", "t"))
    assert (result.error, result.message) == ("http", "HTTP 500 Internal Server Error: NVML not loaded")


def test_a_gzip_bomb_is_cut_off_at_the_limit_after_inflating(odd_server):
    result = fetch_one(poller.Target(1, "h", f"{odd_server.base}/gzip_bomb", "t"))
    assert (result.error, result.message) == ("oversized", f"body over the {MAX_REPORT_BYTES}-byte limit; stopped reading")


def test_redirects_are_not_followed(odd_server):
    result = fetch_one(poller.Target(1, "h", f"{odd_server.base}/redirect", "t"))
    assert (result.error, result.message) == ("http", "HTTP 302 Found")


def test_two_gpus_with_one_index_are_refused(odd_server):
    result = fetch_one(poller.Target(1, "h", f"{odd_server.base}/dup_index", "t"))
    assert (result.error, result.message) == ("invalid", "gpus[1].index: duplicate GPU index 0")


def test_dcgm_exporter_hosts_are_scraped_without_our_token(odd_server):
    dcgm = poller.Target(1, "cp-bm14r7", f"{odd_server.base}/dcgm", "secret-token", kind="dcgm",
                         ib_url=f"{odd_server.base}/node")
    report = fetch_one(dcgm).report
    assert [(g["model"], g["utilization_pct"], g["memory_used_mib"]) for g in report["gpus"]] == [("Tesla T4", 91.0, 5120.0)]
    assert [(p["device"], p["port"]) for p in report["ib_ports"]] == [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)]
    assert report["agent_version"] == "dcgm-exporter, driver 590.48.01"
    # the agent token is for our agent only: an exporter never sees it
    assert fetch_one(poller.Target(1, "h", f"{odd_server.base}/auth", "secret-token", kind="dcgm")).report["gpus"][0]["model"] == "none"


def test_a_metrics_page_without_dcgm_series_is_refused(odd_server):
    result = fetch_one(poller.Target(1, "h", f"{odd_server.base}/other", "", kind="dcgm"))
    assert result.error == "invalid"
    assert result.message.startswith("no DCGM_FI_* series with a GPU UUID label")


def test_a_bad_url_is_an_error_of_that_host_only():
    results = poller.fetch_sync([poller.Target(1, "h", "not a url", "t"), poller.Target(2, "g", "http://127.0.0.1:9", "t")], LIMITS)
    assert results[0].error == "bad_url"
    assert results[1].error == "refused"
