"""Faults of the simulated cluster as an HTTP client with short timeouts sees them, injected
through the control endpoint the reliability tests and the demo use."""
import asyncio
import contextlib
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agent.protocol import MAX_REPORT_BYTES, ProtocolError, derive_token, parse_report
from agent.simulate import CONTROL_TOKEN_NAME, Simulator, parse_hosts

SECRET = "test-secret"
CONTROL = {"Authorization": f"Bearer {derive_token(SECRET, CONTROL_TOKEN_NAME)}"}


def auth(host: str) -> dict:
    return {"Authorization": f"Bearer {derive_token(SECRET, host)}"}


class Clock:
    def __init__(self, t: float = 1_750_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextlib.asynccontextmanager
async def served(sim: Simulator, timeout: float = 2.0):
    server = TestServer(sim.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}",
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            yield session
    finally:
        await server.close()


def simulator(**kwargs) -> Simulator:
    return Simulator(parse_hosts("gpu0001\ngpu0002\ngpu0003\n"), secret=SECRET, **kwargs)


async def inject(session, host, fault, **params) -> dict:
    async with session.post("/control/faults", json={"host": host, "fault": fault, "params": params}, headers=CONTROL) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def report(session, host: str, **kwargs) -> dict:
    async with session.get(f"/h/{host}/v1/report", headers=auth(host), **kwargs) as r:
        assert r.status == 200
        return parse_report(await r.read())


def run(scenario, sim=None, timeout: float = 2.0):
    sim = sim or simulator()

    async def main():
        async with served(sim, timeout) as session:
            return await scenario(session)

    return asyncio.run(main())


# -- connection faults --------------------------------------------------------------------------

def test_down_host_closes_the_connection_and_clear_brings_it_back():
    async def scenario(session):
        await inject(session, "gpu0001", "down")
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get("/h/gpu0001/v1/report", headers=auth("gpu0001")) as r:
                await r.read()
        with pytest.raises(aiohttp.ClientConnectionError):  # every path of the host
            await session.delete("/h/gpu0001/v1/allocations/x", headers=auth("gpu0001"))
        other = await report(session, "gpu0002")
        await inject(session, "gpu0001", "clear")
        return other, await report(session, "gpu0001")

    other, back = run(scenario)
    assert other["host"] == "gpu0002" and back["host"] == "gpu0001"


def test_slow_host_answers_after_the_delay():
    async def scenario(session):
        await inject(session, "gpu0002", "slow", delay_s=0.4)
        started = time.monotonic()
        slow = await report(session, "gpu0002")
        slow_s = time.monotonic() - started
        started = time.monotonic()
        await report(session, "gpu0001")
        return slow, slow_s, time.monotonic() - started

    slow, slow_s, fast_s = run(scenario)
    assert slow["host"] == "gpu0002" and slow_s >= 0.4
    assert fast_s < 0.4


def test_hanging_host_times_the_client_out_without_piling_up_requests():
    async def scenario(session):
        await inject(session, "*", "hang")
        baseline = len(asyncio.all_tasks())
        for _ in range(5):
            with pytest.raises(asyncio.TimeoutError):
                await report(session, "gpu0003", timeout=aiohttp.ClientTimeout(total=0.2))
        await asyncio.sleep(0.1)
        left = len(asyncio.all_tasks()) - baseline
        # A request already waiting is answered as soon as the fault is cleared.
        waiting = asyncio.create_task(report(session, "gpu0001"))
        await asyncio.sleep(0.3)
        still_waiting = not waiting.done()
        await inject(session, "*", "clear")
        return left, still_waiting, await asyncio.wait_for(waiting, 2)

    left, still_waiting, answered = run(scenario)
    assert left <= 0  # the server dropped each handler when its client gave up
    assert still_waiting and answered["host"] == "gpu0001"


def test_hang_gives_up_after_max_s_by_closing_the_connection():
    async def scenario(session):
        await inject(session, "gpu0001", "hang", max_s=0.2)
        with pytest.raises(aiohttp.ClientConnectionError):
            await report(session, "gpu0001")

    run(scenario)


def test_trickle_sends_a_valid_report_one_byte_at_a_time():
    async def scenario(session):
        await inject(session, "gpu0001", "trickle", interval_s=0.05)
        got = b""
        with pytest.raises(asyncio.TimeoutError):
            async with session.get("/h/gpu0001/v1/report", headers=auth("gpu0001"),
                                   timeout=aiohttp.ClientTimeout(total=0.6)) as r:
                status = r.status
                async for chunk in r.content.iter_any():
                    got += chunk
        await inject(session, "gpu0001", "clear")
        return status, got, await report(session, "gpu0001")

    status, got, after = run(scenario)
    assert status == 200
    # A dozen bytes in 0.6 s: each byte arrives well within any read timeout, the whole never does.
    assert 5 <= len(got) <= 20 and b'{"schema":"fabricpool.report/1"'.startswith(got)
    assert after["host"] == "gpu0001"


# -- bad reports ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body, path, message", [
    ("truncated", "", "not JSON"),
    ("binary", "", "not JSON"),
    ("html", "", "not JSON"),
    ("not_object", "", "expected a JSON object"),
    ("wrong_schema", "schema", "unsupported schema 'fabricpool.report/99'"),
    ("invalid_field", "gpus[0].utilization_pct", "must be ≤ 100"),
])
def test_garbage_reports_fail_validation(body, path, message):
    async def scenario(session):
        await inject(session, "gpu0002", "garbage", body=body)
        async with session.get("/h/gpu0002/v1/report", headers=auth("gpu0002")) as r:
            status, raw = r.status, await r.read()
        return status, raw, await report(session, "gpu0003")

    status, raw, healthy = run(scenario)
    assert status == 200
    with pytest.raises(ProtocolError) as caught:
        parse_report(raw)
    assert caught.value.path == path and message in caught.value.message
    assert healthy["host"] == "gpu0003"


async def read_capped(response, limit: int) -> tuple[int, bool]:
    """What a careful poller does: stream the body and stop past the limit."""
    got = 0
    async for chunk in response.content.iter_chunked(65536):
        got += len(chunk)
        if got > limit:
            return got, False
    return got, True


def test_oversized_report_is_streamed_and_the_client_can_stop_early():
    async def scenario(session):
        await inject(session, "gpu0001", "oversized", mb=50)
        async with session.get("/h/gpu0001/v1/report", headers=auth("gpu0001")) as r:
            announced = r.content_length
            got, complete = await read_capped(r, MAX_REPORT_BYTES)
        await inject(session, "gpu0002", "oversized", mb=5, content_length=True)
        async with session.get("/h/gpu0002/v1/report", headers=auth("gpu0002")) as r:
            whole = await r.read()
            length = r.content_length
        return announced, got, complete, whole, length, await report(session, "gpu0003")

    announced, got, complete, whole, length, healthy = run(scenario, timeout=10)
    assert announced is None and not complete
    assert MAX_REPORT_BYTES < got <= MAX_REPORT_BYTES + 65536 * 2
    assert length == len(whole) > 5 * 1024 * 1024  # announced up front when asked to
    data = json.loads(whole)  # valid JSON, just far too big
    assert data["schema"] == "fabricpool.report/1" and data["host"] == "gpu0002"
    with pytest.raises(ProtocolError, match="over the"):
        parse_report(whole)
    assert healthy["host"] == "gpu0003"


# -- faults in the numbers --------------------------------------------------------------------

def test_ecc_errors_grow_on_one_gpu_until_cleared():
    async def scenario(session):
        await inject(session, "gpu0001", "ecc", gpu=3, count=2, corrected=5)
        first = await report(session, "gpu0001")
        await inject(session, "gpu0001", "ecc", gpu=3)
        second = await report(session, "gpu0001")
        await inject(session, "gpu0001", "clear")
        return first, second, await report(session, "gpu0001")

    first, second, cleared = run(scenario)
    assert [g["ecc_uncorrected"] for g in first["gpus"]] == [0, 0, 0, 2, 0, 0, 0, 0]
    assert first["gpus"][3]["ecc_corrected"] == 5
    assert second["gpus"][3]["ecc_uncorrected"] == 3
    assert all(g["ecc_uncorrected"] == 0 for g in cleared["gpus"])


def test_flapping_ib_port_toggles_and_counts_link_downs():
    clock = Clock()
    sim = Simulator(parse_hosts(json.dumps([{"name": "gpu0001", "hcas": ["mlx5_0", "mlx5_1"]}])), secret=SECRET, clock=clock)

    async def scenario(session):
        await inject(session, "gpu0001", "flap_ib", port="mlx5_1", period_s=5)
        seen = []
        for _ in range(4):
            ports = (await report(session, "gpu0001"))["ib_ports"]
            seen.append((ports[0]["state"], ports[1]["state"], ports[1]["phys_state"], ports[1]["counters"]["link_downed"]))
            clock.t += 5
        clock.t -= 2.5  # mid-period: up, after two downs
        await inject(session, "gpu0001", "clear")
        return seen, (await report(session, "gpu0001"))["ib_ports"][1]

    seen, cleared = run(scenario, sim)
    assert seen == [
        ("ACTIVE", "DOWN", "Polling", 1),
        ("ACTIVE", "ACTIVE", "LinkUp", 1),
        ("ACTIVE", "DOWN", "Polling", 2),
        ("ACTIVE", "ACTIVE", "LinkUp", 2),
    ]
    assert cleared["state"] == "ACTIVE" and cleared["counters"]["link_downed"] == 2  # a counter keeps its history


# -- the control endpoint -------------------------------------------------------------------

def test_control_endpoint_needs_its_token_and_refuses_bad_requests_without_changing_anything():
    async def scenario(session):
        out = {}

        async def post(body, headers=CONTROL):
            async with session.post("/control/faults", json=body, headers=headers) as r:
                return r.status, await r.json()

        out["no token"] = await post({"host": "*", "fault": "down"}, headers={})
        out["agent token"] = await post({"host": "*", "fault": "down"}, headers=auth("gpu0001"))
        out["unknown fault"] = await post({"host": "*", "fault": "melt"})
        out["unknown host"] = await post({"host": ["gpu0001", "gpu0404"], "fault": "down"})
        out["bad param"] = await post({"host": "gpu0001", "fault": "slow", "params": {"delay_s": "2"}})
        out["unknown param"] = await post({"host": "gpu0001", "fault": "slow", "params": {"delay": 2}})
        out["no such gpu"] = await post({"host": "*", "fault": "ecc", "params": {"gpu": 8}})
        out["no such port"] = await post({"host": "*", "fault": "flap_ib", "params": {"port": "mlx5_9"}})
        async with session.get("/control/faults", headers=CONTROL) as r:
            out["nothing injected"] = (await r.json())["faults"]
        out["list"] = await post({"host": ["gpu0001", "gpu0003"], "fault": "slow", "params": {"delay_s": 0.1}})
        out["all"] = await post({"host": "*", "fault": "garbage"})
        async with session.get("/control/faults", headers=CONTROL) as r:
            out["injected"] = (await r.json())["faults"]
        async with session.get("/control/faults") as r:
            out["list without token"] = r.status
        async with session.get("/control/hosts", headers=CONTROL) as r:
            out["hosts"] = (await r.json())["hosts"]
        out["clear all"] = await post({"host": "*", "fault": "clear"})
        async with session.get("/control/faults", headers=CONTROL) as r:
            out["cleared"] = (await r.json())["faults"]
        async with session.get("/healthz") as r:
            out["health"] = await r.json()
        return out

    out = run(scenario)
    assert out["no token"][0] == out["agent token"][0] == 401
    assert out["unknown fault"][0] == 400 and out["unknown fault"][1]["path"] == "fault"
    assert out["unknown host"] == (404, {"error": "no simulated host 'gpu0404'", "path": "host"})
    assert out["bad param"] == (400, {"error": "expected a number of seconds 0..3600, got '2'", "path": "params.delay_s"})
    assert out["unknown param"][0] == 400 and out["unknown param"][1]["path"] == "params.delay"
    assert out["no such gpu"][0] == 400 and "no GPU 8" in out["no such gpu"][1]["error"]
    assert out["no such port"][0] == 400 and "mlx5_0" in out["no such port"][1]["error"]
    assert out["nothing injected"] == []
    assert out["list"][1] == {"fault": "slow", "hosts": 2}
    assert out["all"][1] == {"fault": "garbage", "hosts": 3}
    assert sorted((f["host"], f["fault"], json.dumps(f["params"])) for f in out["injected"]) == [
        ("gpu0001", "garbage", '{"body": "truncated"}'), ("gpu0001", "slow", '{"delay_s": 0.1}'),
        ("gpu0002", "garbage", '{"body": "truncated"}'),
        ("gpu0003", "garbage", '{"body": "truncated"}'), ("gpu0003", "slow", '{"delay_s": 0.1}'),
    ]
    assert out["list without token"] == 401
    assert [h["name"] for h in out["hosts"]] == ["gpu0001", "gpu0002", "gpu0003"]
    assert out["hosts"][0]["agent_url"].endswith("/h/gpu0001") and out["hosts"][0]["agent_url"].startswith("http://127.0.0.1:")
    assert out["clear all"][1] == {"fault": "clear", "hosts": 3}
    assert out["cleared"] == []
    assert out["health"] == {"ok": True, "hosts": 3}
