"""The agent's HTTP API through aiohttp's test client, with real processes behind it."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.protocol import ALLOCATION_SCHEMA, MAX_REQUEST_BYTES, parse_report
from agent.report import Collector, GpuReadError
from agent.server import AgentConfig, ConfigError, load_token, make_app
from tests.agent import ttar
from tests.conftest import DATA

TOKEN = "s3cret-token-for-gpu001"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]

GPUS = [
    {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 0,
     "pci_bus_id": "00000000:03:00.0", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []},
    {"index": 1, "uuid": "GPU-bbbb", "model": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 0,
     "pci_bus_id": "00000000:07:00.0", "nearest_hca": "mlx5_1", "mig_mode": False, "mig_instances": []},
    {"index": 2, "uuid": "GPU-cccc", "model": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 0,
     "pci_bus_id": "00000000:0b:00.0", "nearest_hca": "mlx5_1", "mig_mode": False, "mig_instances": []},
]


def serve(tmp_path: Path, scenario, *, read_gpus=None, grace_s: float = 0.4):
    """Run `scenario(client, log_dir)` against a fresh agent app for host gpu001."""
    ttar.extract(DATA / "sysfs_infiniband_node_exporter_fixture.ttar", tmp_path)
    log_dir = tmp_path / "logs"
    collector = Collector("gpu001", sysfs_root=tmp_path / "sys", read_gpus=read_gpus or (lambda: [dict(g) for g in GPUS]))
    config = AgentConfig(host_name="gpu001", token=TOKEN, log_dir=log_dir, grace_s=grace_s, collector=collector)

    async def main():
        async with TestClient(TestServer(make_app(config))) as client:
            await scenario(client, log_dir)

    asyncio.run(main())


def start_body(allocation_id="job-1", command=("sh", "-c", "exit 0"), gpus=("GPU-aaaa",), **extra) -> dict:
    return {"schema": ALLOCATION_SCHEMA, "id": allocation_id, "command": list(command), "gpus": list(gpus), **extra}


async def report(client) -> dict:
    response = await client.get("/v1/report", headers=AUTH)
    assert response.status == 200, await response.text()
    return parse_report(await response.read())


async def allocation_state(client, allocation_id, until, timeout=5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = {a["id"]: a for a in (await report(client))["allocations"]}.get(allocation_id)
        if found and found["state"] in until:
            return found
        assert time.monotonic() < deadline, f"{allocation_id} never reached {until}: {found}"
        await asyncio.sleep(0.05)


# ----------------------------------------------------------------- auth and limits


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer "}])
def test_without_the_token_every_endpoint_is_401_and_nothing_happens(tmp_path, headers):
    async def scenario(client, log_dir):
        response = await client.post("/v1/allocations", headers=AUTH, json=start_body("running", command=["sleep", "30"]))
        assert response.status == 202
        await allocation_state(client, "running", until=("running",))

        attempts = [
            client.get("/v1/report", headers=headers),
            client.post("/v1/allocations", headers=headers, json=start_body("intruder", gpus=["GPU-bbbb"])),
            client.delete("/v1/allocations/running", headers=headers),
            client.post("/v1/allocations/running/ack", headers=headers),
            client.get("/v1/nothing-here", headers=headers),
        ]
        for attempt in attempts:
            response = await attempt
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert await response.json() == {"error": "missing or wrong bearer token", "path": ""}

        await asyncio.sleep(0.2)
        allocations = {a["id"]: a for a in (await report(client))["allocations"]}
        assert list(allocations) == ["running"] and allocations["running"]["state"] == "running"
        assert not (log_dir / "intruder.log").exists()
        await client.delete("/v1/allocations/running", headers=AUTH)
        await allocation_state(client, "running", until=("stopped",))

    serve(tmp_path, scenario)


def test_bodies_over_the_limit_get_413(tmp_path):
    async def scenario(client, log_dir):
        big = start_body(env={"PAD": "x" * MAX_REQUEST_BYTES})
        response = await client.post("/v1/allocations", headers=AUTH, json=big)
        assert response.status == 413
        assert await response.json() == {"error": f"request body over the {MAX_REQUEST_BYTES}-byte limit", "path": ""}

        async def chunks():  # no Content-Length: the limit still holds while reading
            for _ in range(MAX_REQUEST_BYTES // 8192 + 2):
                yield b" " * 8192
        response = await client.post("/v1/allocations", headers=AUTH, data=chunks())
        assert response.status == 413
        assert (await report(client))["allocations"] == []
        assert not list(log_dir.glob("*.log"))

    serve(tmp_path, scenario)


@pytest.mark.parametrize("body, status, path, message", [
    (b"{not json", 400, "", "not JSON"),
    (json.dumps({"schema": ALLOCATION_SCHEMA, "id": "x", "command": [], "gpus": ["GPU-aaaa"]}).encode(), 400, "command", "non-empty list"),
    (json.dumps(start_body(gpus=["GPU-elsewhere"])).encode(), 409, "gpus[0]", "not on this host"),
    (json.dumps(start_body("../../x")).encode(), 400, "id", "names the log file"),
])
def test_bad_requests_get_json_errors_with_the_field(tmp_path, body, status, path, message):
    async def scenario(client, log_dir):
        response = await client.post("/v1/allocations", headers={**AUTH, "Content-Type": "application/json"}, data=body)
        assert response.status == status
        error = await response.json()
        assert error["path"] == path and message in error["error"]

    serve(tmp_path, scenario)


def test_unknown_paths_and_methods_are_json_too(tmp_path):
    async def scenario(client, log_dir):
        response = await client.get("/v1/nothing-here", headers=AUTH)
        assert (response.status, (await response.json())["error"]) == (404, "Not Found")
        response = await client.put("/v1/report", headers=AUTH)
        assert response.status == 405 and "error" in await response.json()
        response = await client.delete("/v1/allocations/ghost", headers=AUTH)
        assert response.status == 404 and await response.json() == {"error": "no allocation ghost on this host", "path": "id"}

    serve(tmp_path, scenario)


# ----------------------------------------------------------------- report


def test_report_passes_the_protocol(tmp_path):
    async def scenario(client, log_dir):
        data = await report(client)
        assert (data["host"], data["schema"]) == ("gpu001", "fabricpool.report/1")
        assert [g["uuid"] for g in data["gpus"]] == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
        assert {(p["device"], p["port"]) for p in data["ib_ports"]} == {("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)}
        assert data["cpu"]["count"] >= 1 and data["memory"]["total_mib"] > 0
        assert abs(data["time"] - time.time()) < 5

    serve(tmp_path, scenario)


def test_gpu_read_failure_is_503_and_a_bug_is_500_without_traceback(tmp_path):
    calls = []

    def read_gpus():
        calls.append(1)
        if len(calls) == 1:
            raise GpuReadError("nvidia-smi exited with 9: NVIDIA-SMI has failed")
        if len(calls) == 2:
            return [{**GPUS[0], "temperature_c": 900}]
        raise KeyError("a bug in a reader")

    async def scenario(client, log_dir):
        response = await client.get("/v1/report", headers=AUTH)
        assert response.status == 503
        assert await response.json() == {"error": "cannot read the GPUs: nvidia-smi exited with 9: NVIDIA-SMI has failed", "path": ""}
        response = await client.get("/v1/report", headers=AUTH)
        assert response.status == 500
        assert await response.json() == {"error": "the agent built an invalid report: must be ≤ 200, got 900",
                                         "path": "gpus[0].temperature_c"}
        response = await client.get("/v1/report", headers=AUTH)
        text = await response.text()
        assert response.status == 500 and json.loads(text)["error"] == "internal error in the agent; see its log"
        assert "Traceback" not in text and "KeyError" not in text

    serve(tmp_path, scenario, read_gpus=read_gpus)


# ----------------------------------------------------------------- allocations


def test_allocation_runs_with_its_gpus_and_hcas_and_is_reported_until_acknowledged(tmp_path):
    async def scenario(client, log_dir):
        body = start_body("train-1", ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $NCCL_IB_HCA"; sleep 0.2'],
                          gpus=["GPU-bbbb", "GPU-aaaa", "GPU-cccc"])
        response = await client.post("/v1/allocations", headers=AUTH, json=body)
        assert response.status == 202
        assert await response.json() == {"id": "train-1", "state": "starting"}
        running = await allocation_state(client, "train-1", until=("running",))
        assert running["gpus"] == ["GPU-bbbb", "GPU-aaaa", "GPU-cccc"] and running["started_at"]

        # the same request again (a retried POST) is not a second job
        response = await client.post("/v1/allocations", headers=AUTH, json=body)
        assert response.status == 200 and (await response.json())["id"] == "train-1"
        # its GPUs are taken
        response = await client.post("/v1/allocations", headers=AUTH, json=start_body("other", gpus=["GPU-cccc"]))
        assert response.status == 409
        assert await response.json() == {"error": "GPU GPU-cccc is in use by allocation train-1", "path": "gpus[0]"}
        response = await client.post("/v1/allocations/train-1/ack", headers=AUTH)
        assert response.status == 409

        done = await allocation_state(client, "train-1", until=("succeeded", "failed"))
        assert (done["state"], done["exit_code"]) == ("succeeded", 0)
        assert (log_dir / "train-1.log").read_text() == "GPU-bbbb,GPU-aaaa,GPU-cccc =mlx5_1,mlx5_0\n"

        await asyncio.sleep(0.1)
        assert [a["id"] for a in (await report(client))["allocations"]] == ["train-1"]  # still there
        response = await client.post("/v1/allocations/train-1/ack", headers=AUTH)
        assert (response.status, await response.json()) == (200, {"id": "train-1", "acknowledged": True})
        assert (await report(client))["allocations"] == []

    serve(tmp_path, scenario)


def test_failed_work_reports_its_exit_code(tmp_path):
    async def scenario(client, log_dir):
        await client.post("/v1/allocations", headers=AUTH, json=start_body("crash", ["sh", "-c", "echo oom >&2; exit 137"]))
        done = await allocation_state(client, "crash", until=("succeeded", "failed"))
        assert (done["state"], done["exit_code"], done["reason"]) == ("failed", 137, "exited with code 137")
        assert (log_dir / "crash.log").read_text() == "oom\n"

    serve(tmp_path, scenario)


def test_delete_stops_with_sigterm_then_sigkill_after_the_grace(tmp_path):
    async def scenario(client, log_dir):
        await client.post("/v1/allocations", headers=AUTH, json=start_body("sleeper", ["sleep", "60"]))
        await client.post("/v1/allocations", headers=AUTH,
                          json=start_body("stubborn", ["sh", "-c", "trap '' TERM; sleep 60"], gpus=["GPU-bbbb"]))
        await allocation_state(client, "stubborn", until=("running",))
        await allocation_state(client, "sleeper", until=("running",))

        began = time.monotonic()
        response = await client.delete("/v1/allocations/sleeper", headers=AUTH)
        assert response.status == 202
        assert await response.json() == {"id": "sleeper", "state": "running", "stop_requested": True}
        stopped = await allocation_state(client, "sleeper", until=("stopped",))
        assert stopped["reason"] == "stopped on request (SIGTERM)" and stopped["exit_code"] == -15
        assert time.monotonic() - began < 0.4  # no need to wait for the grace period

        began = time.monotonic()
        await client.delete("/v1/allocations/stubborn", headers=AUTH)
        await asyncio.sleep(0.2)
        assert (await allocation_state(client, "stubborn", until=("running", "stopped")))["state"] == "running"
        killed = await allocation_state(client, "stubborn", until=("stopped",))
        assert time.monotonic() - began >= 0.4
        assert (killed["exit_code"], killed["reason"]) == (-9, "stopped on request (SIGKILL after 0.4 s grace)")

        # the GPUs are free again
        response = await client.post("/v1/allocations", headers=AUTH, json=start_body("next", gpus=["GPU-aaaa", "GPU-bbbb"]))
        assert response.status == 202

    serve(tmp_path, scenario)


def test_multi_host_work_gets_the_rendezvous_variables(tmp_path):
    async def scenario(client, log_dir):
        body = start_body("ddp", ["sh", "-c", 'echo "$MASTER_ADDR:$MASTER_PORT $WORLD_SIZE $NODE_RANK $NPROC_PER_NODE"'],
                          gpus=["GPU-aaaa", "GPU-bbbb"],
                          distributed={"master_addr": "gpu007", "master_port": 29500, "world_size": 4, "node_rank": 1})
        await client.post("/v1/allocations", headers=AUTH, json=body)
        await allocation_state(client, "ddp", until=("succeeded",))
        assert (log_dir / "ddp.log").read_text() == "gpu007:29500 4 1 2\n"

    serve(tmp_path, scenario)


# ----------------------------------------------------------------- token file and CLI


def test_token_file_must_exist_be_non_empty_and_private(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_token(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        load_token(empty)
    shared = tmp_path / "shared"
    shared.write_text(TOKEN)
    shared.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by every user; run: chmod 600"):
        load_token(shared)
    shared.chmod(0o600)
    shared.write_text(f"  {TOKEN}\n")
    assert load_token(shared) == TOKEN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_python_m_agent_serve(tmp_path):
    token_file = tmp_path / "token"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    refused = subprocess.run([sys.executable, "-m", "agent", "serve", "--token-file", str(token_file)],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
    assert refused.returncode == 2 and f"agent: token file {token_file} does not exist" in refused.stderr

    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    port = _free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--port", str(port), "--bind", "127.0.0.1", "--token-file", str(token_file),
         "--host-name", "gpu042", "--log-dir", str(tmp_path / "logs"), "--sysfs-root", str(tmp_path), "--gpu-source", "none"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    async def fetch():
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/v1/report", headers=AUTH) as response:
                        return response.status, await response.json()
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
        raise AssertionError("the agent never answered")

    try:
        status, data = asyncio.run(fetch())
        assert status == 200 and parse_report(data)["host"] == "gpu042"
        assert data["gpus"] == [] and data["ib_ports"] == []
    finally:
        agent.terminate()
        agent.wait(timeout=10)
