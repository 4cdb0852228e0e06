"""The simulated cluster as a poller and an operator see it: one process, one port, a
virtual agent per host that speaks the agent protocol and behaves like a GPU host."""
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agent.protocol import (
    ALLOCATION_SCHEMA,
    MAX_REQUEST_BYTES,
    derive_token,
    parse_report,
)
from agent.simulate import HostsError, Simulator, load_hosts_file, main, parse_hosts

SECRET = "test-secret"
T0 = 1_750_000_000.0


class Clock:
    """Simulated time the test moves by hand."""

    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def auth(host: str) -> dict:
    return {"Authorization": f"Bearer {derive_token(SECRET, host)}"}


@contextlib.asynccontextmanager
async def served(sim: Simulator):
    server = TestServer(sim.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}", timeout=aiohttp.ClientTimeout(total=10)) as session:
            yield session
    finally:
        await server.close()


async def get_report(session, host: str) -> dict:
    async with session.get(f"/h/{host}/v1/report", headers=auth(host)) as response:
        assert response.status == 200, await response.text()
        return parse_report(await response.read())


def request(alloc_id: str, gpus: list[str], **extra) -> dict:
    return {"schema": ALLOCATION_SCHEMA, "id": alloc_id, "command": ["python", "train.py"], "gpus": gpus, **extra}


def simulator(text: str = "gpu0001\ngpu0002\n", **kwargs) -> Simulator:
    kwargs.setdefault("clock", Clock())
    return Simulator(parse_hosts(text), secret=SECRET, **kwargs)


HOSTS_JSON = json.dumps([
    {"name": "gpu0001", "gpus": 8, "hcas": ["mlx5_0"]},
    {"name": "gpu0002", "gpus": 4, "hcas": ["mlx5_0", "mlx5_1"], "gpu_model": "NVIDIA H200"},
    {"name": "a100-07", "gpus": 2, "hcas": [{"device": "mlx5_3", "node_guid": "0x0c42a10300000007", "lid": 17, "rate_gbps": 200}],
     "gpu_model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
])


# -- the protocol ----------------------------------------------------------------------------

def test_every_host_serves_a_valid_report_of_its_own_hardware():
    from pool.services import synthetic_gpu_uuid

    sim = simulator(HOSTS_JSON)

    async def scenario():
        async with served(sim) as session:
            return {name: await get_report(session, name) for name in ("gpu0001", "gpu0002", "a100-07")}

    reports = asyncio.run(scenario())
    assert [r["host"] for r in reports.values()] == ["gpu0001", "gpu0002", "a100-07"]
    assert [len(r["gpus"]) for r in reports.values()] == [8, 4, 2]
    # The GPUs build_fattree registered: reports update the same GPU rows.
    assert [g["uuid"] for g in reports["gpu0001"]["gpus"]] == [synthetic_gpu_uuid("gpu0001", i) for i in range(8)]
    assert {g["model"] for g in reports["gpu0002"]["gpus"]} == {"NVIDIA H200"}
    assert reports["gpu0002"]["gpus"][0]["memory_total_mib"] == 143771
    # GPU i sits next to HCA i mod R, as build_fattree registers it.
    assert [g["nearest_hca"] for g in reports["gpu0002"]["gpus"]] == ["mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"]
    port = reports["a100-07"]["ib_ports"][0]
    assert (port["device"], port["node_guid"], port["lid"], port["rate_gbps"], port["state"]) == (
        "mlx5_3", "0x0c42a10300000007", 17, 200.0, "ACTIVE")
    assert reports["a100-07"]["gpus"][0]["power_limit_w"] == 400
    assert reports["gpu0001"]["agent_version"].endswith("+sim")


def test_wrong_or_missing_token_gets_401_and_does_nothing():
    sim = simulator()

    async def scenario():
        async with served(sim) as session:
            gpu = (await get_report(session, "gpu0001"))["gpus"][0]["uuid"]
            results = []
            for headers in ({}, {"Authorization": "Bearer nope"}, auth("gpu0002"), {"Authorization": derive_token(SECRET, "gpu0001")}):
                async with session.post("/h/gpu0001/v1/allocations", json=request("a1", [gpu]), headers=headers) as r:
                    results.append((r.status, (await r.json())["path"], r.headers.get("WWW-Authenticate")))
                async with session.get("/h/gpu0001/v1/report", headers=headers) as r:
                    results.append((r.status,))
            async with session.get("/h/gpu9999/v1/report", headers=auth("gpu9999")) as r:
                unknown = r.status, await r.json()
            return results, unknown, await get_report(session, "gpu0001")

    results, unknown, report = asyncio.run(scenario())
    assert results == [(401, "Authorization", 'Bearer realm="fabricpool-agent"'), (401,)] * 4
    assert report["allocations"] == []
    assert unknown[0] == 404 and "gpu9999" in unknown[1]["error"]


def test_allocation_runs_for_its_duration_then_waits_for_the_ack():
    """Real time, as the poller lives it: starting -> running (GPUs busy) -> succeeded with
    an exit code, reported until the server acknowledges it."""
    sim = simulator(clock=time.time)

    async def scenario():
        async with served(sim) as session:
            gpus = [g["uuid"] for g in (await get_report(session, "gpu0001"))["gpus"]]
            seen = {}
            async with session.post("/h/gpu0001/v1/allocations", json=request("job-1", gpus[:4], duration_s=0.5),
                                    headers=auth("gpu0001")) as r:
                seen["post"] = r.status, await r.json()
            await asyncio.sleep(0.25)
            seen["running"] = await get_report(session, "gpu0001")
            await asyncio.sleep(0.4)
            seen["finished"] = await get_report(session, "gpu0001")
            await asyncio.sleep(0.1)
            seen["still"] = await get_report(session, "gpu0001")
            async with session.post("/h/gpu0001/v1/allocations/job-1/ack", headers=auth("gpu0001")) as r:
                seen["ack"] = r.status, await r.json()
            seen["after"] = await get_report(session, "gpu0001")
            async with session.post("/h/gpu0001/v1/allocations/job-1/ack", headers=auth("gpu0001")) as r:
                seen["ack again"] = r.status
            async with session.post("/h/gpu0001/v1/allocations/job-2/ack", headers=auth("gpu0001")) as r:
                seen["ack unknown"] = r.status
            async with session.post("/h/gpu0001/v1/allocations", json=request("job-1", gpus[:4], duration_s=0.5),
                                    headers=auth("gpu0001")) as r:
                seen["reuse id"] = r.status, await r.json()
            return gpus, seen

    gpus, seen = asyncio.run(scenario())
    assert seen["post"] == (202, {"id": "job-1", "state": "starting"})
    (running,) = seen["running"]["allocations"]
    assert running["state"] == "running" and running["exit_code"] is None and running["started_at"] > 0
    assert running["gpus"] == gpus[:4]
    utilization = [g["utilization_pct"] for g in seen["running"]["gpus"]]
    assert min(utilization[:4]) >= 80 and max(utilization[4:]) <= 3
    assert min(g["memory_used_mib"] for g in seen["running"]["gpus"][:4]) > 500
    (finished,) = seen["finished"]["allocations"]
    assert (finished["state"], finished["exit_code"]) == ("succeeded", 0)
    assert finished["finished_at"] >= finished["started_at"]
    assert max(g["utilization_pct"] for g in seen["finished"]["gpus"]) <= 3
    assert seen["still"]["allocations"] == seen["finished"]["allocations"]
    assert seen["ack"] == (200, {"id": "job-1", "acknowledged": True})
    assert seen["after"]["allocations"] == []
    assert seen["ack again"] == 200  # a retried ack is fine
    assert seen["ack unknown"] == 404
    assert seen["reuse id"][0] == 409 and "acknowledged" in seen["reuse id"][1]["error"]


def test_delete_stops_work_after_a_short_grace():
    clock = Clock()
    sim = simulator(clock=clock, stop_grace_s=1.0)

    async def scenario():
        async with served(sim) as session:
            gpus = [g["uuid"] for g in (await get_report(session, "gpu0001"))["gpus"]]
            h = auth("gpu0001")
            out = {}
            await session.post("/h/gpu0001/v1/allocations", json=request("long", gpus[:2], duration_s=3600), headers=h)
            clock.advance(30)
            async with session.post("/h/gpu0001/v1/allocations/long/ack", headers=h) as r:
                out["ack running"] = r.status, (await r.json())["error"]
            async with session.delete("/h/gpu0001/v1/allocations/long", headers=h) as r:
                out["delete"] = r.status, await r.json()
            clock.advance(0.5)
            out["grace"] = (await get_report(session, "gpu0001"))["allocations"][0]["state"]
            clock.advance(1)
            out["stopped"] = (await get_report(session, "gpu0001"))["allocations"][0]
            async with session.delete("/h/gpu0001/v1/allocations/other", headers=h) as r:
                out["delete unknown"] = r.status
            # Stopped before it ever ran: no exit code.
            await session.post("/h/gpu0001/v1/allocations", json=request("early", gpus[2:3], duration_s=60), headers=h)
            await session.delete("/h/gpu0001/v1/allocations/early", headers=h)
            clock.advance(0.1)
            out["early"] = next(a for a in (await get_report(session, "gpu0001"))["allocations"] if a["id"] == "early")
            clock.advance(60)
            out["idle again"] = await get_report(session, "gpu0001")
            return out

    out = asyncio.run(scenario())
    assert out["ack running"][0] == 409 and "still running" in out["ack running"][1]
    assert out["delete"] == (202, {"id": "long", "state": "running", "stop_requested": True})
    assert out["grace"] == "running"
    assert (out["stopped"]["state"], out["stopped"]["exit_code"]) == ("stopped", -15)
    assert "SIGTERM" in out["stopped"]["reason"]
    assert out["stopped"]["finished_at"] == pytest.approx(T0 + 31.0)
    assert out["delete unknown"] == 404
    assert (out["early"]["state"], out["early"]["exit_code"], out["early"]["started_at"]) == ("stopped", None, None)
    assert max(g["utilization_pct"] for g in out["idle again"]["gpus"]) <= 3


def test_requests_the_agent_would_refuse():
    clock = Clock()
    sim = simulator(clock=clock)

    async def scenario():
        async with served(sim) as session:
            gpus = [g["uuid"] for g in (await get_report(session, "gpu0001"))["gpus"]]
            other_host_gpu = (await get_report(session, "gpu0002"))["gpus"][0]["uuid"]
            h = auth("gpu0001")

            async def post(body, raw=None):
                async with session.post("/h/gpu0001/v1/allocations", headers=h, **({"data": raw} if raw is not None else {"json": body})) as r:
                    return r.status, await r.json()

            return {
                "first": await post(request("a", gpus[:2])),
                "retry": await post(request("a", gpus[:2])),
                "same id, other request": await post(request("a", gpus[2:4])),
                "busy gpu": await post(request("b", gpus[1:3])),
                "foreign gpu": await post(request("c", [other_host_gpu])),
                "twice": await post(request("d", [gpus[5], gpus[5]])),
                "bad schema": await post({**request("e", gpus[4:5]), "command": "rm -rf /"}),
                "bad id": await post(request("../etc", gpus[4:5])),
                "not json": await post(None, raw=b"{nope"),
                "too big": await post(None, raw=b"x" * (MAX_REQUEST_BYTES + 1)),
                "report": await get_report(session, "gpu0001"),
            }

    out = asyncio.run(scenario())
    assert out["first"][0] == 202
    assert out["retry"] == (200, {"id": "a", "state": "starting"})
    assert out["same id, other request"][0] == 409
    assert out["busy gpu"][0] == 409 and out["busy gpu"][1]["path"] == "gpus[0]" and "allocation a" in out["busy gpu"][1]["error"]
    assert out["foreign gpu"][0] == 409 and "not on this host" in out["foreign gpu"][1]["error"]
    assert out["twice"] == (400, {"error": f"GPU {out['report']['gpus'][5]['uuid']} is listed twice", "path": "gpus[1]"})
    assert out["bad schema"][0] == 400 and out["bad schema"][1]["path"] == "command"
    assert out["bad id"][0] == 400 and out["bad id"][1]["path"] == "id"
    assert out["not json"][0] == 400 and "not JSON" in out["not json"][1]["error"]
    assert out["too big"][0] == 413
    assert [a["id"] for a in out["report"]["allocations"]] == ["a"]


def test_failures_end_with_an_exit_code():
    clock = Clock()
    sim = simulator("\n".join(f"h{i}" for i in range(40)), clock=clock, failure_rate=0.5)
    for name, host in sim.hosts.items():
        host.start(request(f"{name}-job", [host.gpus[0].spec.uuid], duration_s=10), clock(), 60)
    failing = sim.hosts["h0"]
    failing.start(request("crash", [failing.gpus[1].spec.uuid], duration_s=10, workload="failing"), clock(), 60)
    clock.advance(11)
    outcomes = [a for host in sim.hosts.values() for a in host.report(clock())["allocations"]]
    codes = {a["id"]: (a["state"], a["exit_code"]) for a in outcomes}
    assert codes["crash"] == ("failed", 1)
    failed = sum(1 for state, _ in codes.values() if state == "failed")
    assert 10 <= failed <= 31  # about half of 41
    assert {codes[k] for k in codes} == {("failed", 1), ("succeeded", 0)}
    assert all(a["reason"] == "exited with code 1" for a in outcomes if a["state"] == "failed")


# -- behaviour --------------------------------------------------------------------------------

def _mean(values):
    values = list(values)
    return sum(values) / len(values)


def test_busy_and_idle_hosts_look_like_a_cluster():
    """Idle: ~0 %, ~70 W, 30-40 °C, IB counters barely move. A multi-host training job:
    90-100 %, most of the memory, power at once, temperature over a minute, and the HCA
    pushing hundreds of Gb/s."""
    clock = Clock()
    sim = simulator(clock=clock)
    busy, idle = sim.hosts["gpu0001"], sim.hosts["gpu0002"]
    busy.start(request("train", [g.spec.uuid for g in busy.gpus], duration_s=3600, workload="training",
                       distributed={"world_size": 16, "node_rank": 3}), clock(), 60)
    clock.advance(1.5)  # running for a moment
    early = busy.report(clock())
    clock.advance(8.5)
    at_10s = {"busy": busy.report(clock()), "idle": idle.report(clock())}
    clock.advance(170)
    at_180s = {"busy": busy.report(clock()), "idle": idle.report(clock())}

    for report in (at_10s["idle"], at_180s["idle"]):
        assert max(g["utilization_pct"] for g in report["gpus"]) <= 3
        assert all(g["memory_used_mib"] == 0 for g in report["gpus"])
        assert all(60 <= g["power_w"] <= 80 for g in report["gpus"])
        assert all(29 <= g["temperature_c"] <= 37 for g in report["gpus"])
        assert report["cpu"]["percent"] < 5
    busy_now = at_180s["busy"]
    assert _mean(g["utilization_pct"] for g in busy_now["gpus"]) >= 85
    assert all(g["memory_used_mib"] > 0.8 * g["memory_total_mib"] for g in busy_now["gpus"])
    assert all(g["power_w"] > 550 for g in busy_now["gpus"])
    assert all(g["temperature_c"] >= 58 for g in busy_now["gpus"])
    assert busy_now["cpu"]["percent"] > 20 and busy_now["memory"]["used_mib"] > at_180s["idle"]["memory"]["used_mib"] * 5

    # Lag: utilization jumps at once, power within seconds, temperature over a minute.
    assert _mean(g["utilization_pct"] for g in early["gpus"]) >= 85
    assert _mean(g["temperature_c"] for g in early["gpus"]) < 40
    assert _mean(g["power_w"] for g in early["gpus"]) < _mean(g["power_w"] for g in at_10s["busy"]["gpus"])
    assert _mean(g["temperature_c"] for g in early["gpus"]) < _mean(g["temperature_c"] for g in at_10s["busy"]["gpus"]) \
        < _mean(g["temperature_c"] for g in busy_now["gpus"])

    def moved(name, counter):
        return at_180s[name]["ib_ports"][0]["counters"][counter] - at_10s[name]["ib_ports"][0]["counters"][counter]

    gbps = moved("busy", "port_xmit_data_bytes") * 8 / 170 / 1e9
    assert 150 <= gbps <= 400  # a 400 Gb/s NDR port carrying all-reduce traffic
    assert moved("busy", "port_rcv_data_bytes") > 0.9 * moved("busy", "port_xmit_data_bytes")
    assert moved("busy", "port_xmit_packets") > 0 and moved("busy", "port_xmit_wait") > 0
    assert 0 < moved("idle", "port_xmit_data_bytes") < 10_000_000
    assert at_180s["busy"]["ib_ports"][0]["counters"]["symbol_error"] == 0


def test_inference_is_bursty_and_simulation_steady():
    clock = Clock()
    sim = simulator(clock=clock)
    a, b = sim.hosts["gpu0001"], sim.hosts["gpu0002"]
    a.start(request("serve", [a.gpus[0].spec.uuid], duration_s=3600, workload="inference"), clock(), 60)
    b.start(request("cfd", [b.gpus[0].spec.uuid], duration_s=3600, workload="simulation"), clock(), 60)
    inference, simulation = [], []
    for _ in range(120):
        clock.advance(1)
        inference.append(a.report(clock())["gpus"][0]["utilization_pct"])
        simulation.append(b.report(clock())["gpus"][0]["utilization_pct"])
    assert 30 <= _mean(inference) <= 65 and max(inference) - min(inference) >= 30
    assert min(inference) < 30  # quiet moments between bursts
    assert 65 <= _mean(simulation) <= 90


def test_same_seed_same_cluster():
    def run(seed):
        clock = Clock()
        sim = simulator(HOSTS_JSON, clock=clock, seed=seed)
        host = sim.hosts["gpu0001"]
        host.start(request("j", [g.spec.uuid for g in host.gpus[:3]], duration_s=30, workload="inference"), clock(), 60)
        reports = []
        for step in (0.5, 7, 20, 40):
            clock.advance(step)
            reports.append([h.report(clock()) for h in sim.hosts.values()])
        return reports

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_numbers_do_not_depend_on_how_often_someone_polls():
    def final(polls):
        clock = Clock()
        host = simulator(clock=clock).hosts["gpu0001"]
        host.start(request("j", [host.gpus[0].spec.uuid], duration_s=25, distributed={"world_size": 2}), clock(), 60)
        for k in range(1, polls):
            clock.t = T0 + k * 60.5 / polls
            host.report(clock())
        clock.t = T0 + 60.5
        return host.report(clock())

    once, often = final(1), final(37)
    assert once["ib_ports"][0]["counters"] == pytest.approx(often["ib_ports"][0]["counters"], rel=1e-9, abs=2)
    assert once["gpus"] == often["gpus"]


# -- hosts files ------------------------------------------------------------------------------

def test_hosts_file_json_and_plain_text(tmp_path):
    plain = tmp_path / "hosts.txt"
    plain.write_text("# rack 1\ngpu0001\n\n  gpu0002  # spare\n")
    hosts = load_hosts_file(plain, gpus_per_host=4, gpu_model="NVIDIA L40S")
    assert [(h.name, len(h.gpus), h.gpus[0].model, h.gpus[0].memory_mib) for h in hosts] == [
        ("gpu0001", 4, "NVIDIA L40S", 46068), ("gpu0002", 4, "NVIDIA L40S", 46068)]
    as_json = tmp_path / "hosts.json"
    as_json.write_text(HOSTS_JSON)
    hosts = load_hosts_file(as_json)
    assert [(h.name, len(h.gpus), [c.device for c in h.hcas]) for h in hosts] == [
        ("gpu0001", 8, ["mlx5_0"]), ("gpu0002", 4, ["mlx5_0", "mlx5_1"]), ("a100-07", 2, ["mlx5_3"])]
    explicit = parse_hosts(json.dumps({"hosts": [{"name": "x1", "gpus": [
        {"index": 0, "uuid": "GPU-aaaa", "nearest_hca": "mlx5_1"}, {"index": 3, "uuid": "GPU-bbbb"}]}]}))
    assert [(g.index, g.uuid, g.nearest_hca) for g in explicit[0].gpus] == [(0, "GPU-aaaa", "mlx5_1"), (3, "GPU-bbbb", "mlx5_0")]
    assert parse_hosts('["a", "b"]')[1].name == "b"


@pytest.mark.parametrize("text, message", [
    ("", "no hosts"),
    ("# only a comment\n", "no hosts"),
    ("[1, 2", "not valid JSON"),
    ('{"name": "x"}', "expected a JSON list"),
    ("gpu1\ngpu2\ngpu1\n", "line 3: host 'gpu1' is already listed at"),
    ("gpu 1\n", "line 1: name 'gpu 1' is not a host name"),
    ('[{"name": "../etc"}]', "hosts[0]: name '../etc'"),
    ('[{"name": "a", "gpus": -1}]', "hosts[0].gpus: expected a whole number 0..64, got -1"),
    ('[{"name": "a", "gpus": "8"}]', "hosts[0].gpus: expected a whole number"),
    ('[{"name": "a", "hcas": "mlx5_0"}]', "hosts[0].hcas: expected a list"),
    ('[{"name": "a", "hcas": ["mlx5_0", "mlx5_0"]}]', "listed twice"),
    ('[{"name": "a", "gpu": 8}]', "hosts[0]: unknown field 'gpu'"),
    ('[{"name": "a"}, 7]', "hosts[1]: expected a host name or an object, got int"),
    ('[{"name": "a", "gpus": [{"index": 0}, {"index": 0}]}]', "must be unique"),
])
def test_bad_hosts_files_are_refused_with_where_and_why(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(HostsError) as caught:
        load_hosts_file(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_command_line_errors_are_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FABRICPOOL_AGENT_SECRET", raising=False)
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu0001\n")
    assert main(["--hosts-file", str(tmp_path / "missing")]) == 2
    assert "missing: No such file or directory" in capsys.readouterr().err
    assert main(["--hosts-file", str(hosts)]) == 2
    assert "no token secret" in capsys.readouterr().err
    empty = tmp_path / "secret"
    empty.write_text("\n")
    assert main(["--hosts-file", str(hosts), "--token-secret-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--hosts-file", str(hosts), "--fabric", "f"])
    assert "not allowed with" in capsys.readouterr().err


def test_the_command_serves_until_sigterm(tmp_path):
    """`python -m agent.simulate` as an operator starts it: it prints where the agents are,
    serves them with the tokens of the given secret, and exits cleanly on SIGTERM."""
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu0001\ngpu0002\n")
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(
        [sys.executable, "-m", "agent.simulate", "--hosts-file", str(hosts), "--token-secret-file", str(secret),
         "--port", "0", "--seed", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("simulating 2 hosts (16 GPUs), seed 3"), lines
        base = lines[1].split()[2].removesuffix("/h/{host}")

        async def fetch():
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session, \
                    session.get(f"{base}/h/gpu0002/v1/report", headers=auth("gpu0002")) as r:
                return parse_report(await r.read())

        assert asyncio.run(fetch())["host"] == "gpu0002"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.django_db
def test_hosts_of_a_fabric_come_from_the_database(capsys):
    from django.core.management import call_command

    from agent.simulate import load_fabric_hosts, server_token_secret
    from fabric.models import ChannelAdapter, Port
    from pool.models import Gpu
    from pool.tokens import agent_secret

    call_command("build_fattree", fabric="simfab", spines=2, leaves=2, hosts_per_leaf=2, hcas_per_host=2,
                 gpus_per_host=4, verbosity=0)
    hosts = load_fabric_hosts("simfab")
    assert [h.name for h in hosts] == ["gpu0001", "gpu0002"]
    first = hosts[0]
    assert [(g.index, g.uuid, g.nearest_hca) for g in first.gpus] == list(
        Gpu.objects.filter(host__name="gpu0001").order_by("index").values_list("index", "uuid", "nearest_hca"))
    adapter = ChannelAdapter.objects.get(description="gpu0001 mlx5_1")
    hca = first.hcas[1]
    assert (hca.device, hca.node_guid, hca.lid) == ("mlx5_1", f"0x{adapter.guid}", Port.objects.get(adapter=adapter).lid)
    assert hca.rate_gbps == 400  # 4x NDR
    assert server_token_secret()[0] == agent_secret()
    with pytest.raises(HostsError, match="no fabric named 'nope'; known: simfab"):
        load_fabric_hosts("nope")
    assert main(["--fabric", "nope"]) == 2
    assert capsys.readouterr().err == "simulate: error: no fabric named 'nope'; known: simfab\n"


# -- speed ------------------------------------------------------------------------------------

def test_report_speed_for_4096_hosts(capsys):
    """Not a timing assertion (shared CI machines vary): prints what one simulator process
    spends building and serialising a report, the budget being well under 1 ms."""
    clock = Clock()
    sim = simulator("\n".join(f"gpu{i:04d}" for i in range(1, 4097)), clock=clock)
    for i, host in enumerate(sim.hosts.values()):
        if i % 3 == 0:
            host.start(request(f"j{i}", [g.spec.uuid for g in host.gpus], duration_s=600, distributed={"world_size": 8}),
                       clock(), 60)
    clock.advance(10)
    started = time.perf_counter()
    bodies = [json.dumps(host.report(clock()), separators=(",", ":")).encode() for host in sim.hosts.values()]
    elapsed = time.perf_counter() - started
    for body in bodies[::256]:
        parse_report(body)
    with capsys.disabled():
        print(f"\n4096 simulated reports (8 GPUs each) built and serialised in {elapsed:.3f} s: "
              f"{len(bodies) / elapsed:,.0f} reports/s, {elapsed / len(bodies) * 1e6:.0f} µs each, "
              f"{sum(map(len, bodies)) / len(bodies):,.0f} bytes each")
