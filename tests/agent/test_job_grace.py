"""A job's own grace period on stop (`grace_period_s` in the allocation request): parsed
compatibly (absent: nothing changes), used by the launcher for SIGTERM -> SIGKILL instead of
the agent's --grace-seconds, kept across an agent restart, and refused when out of range."""
from __future__ import annotations

import asyncio
import json

import pytest

from agent import launcher as launcher_module
from agent.launcher import Launcher
from agent.protocol import ALLOCATION_SCHEMA, ProtocolError, parse_allocation_request

from .test_server import AUTH, allocation_state, serve, start_body

INVENTORY = [{"uuid": "GPU-a", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []},
             {"uuid": "GPU-b", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []}]
STUBBORN = ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]


def body(**extra) -> dict:
    return {"schema": ALLOCATION_SCHEMA, "id": "job-1", "command": ["true"], "gpus": ["GPU-a"], **extra}


def test_the_field_is_optional_and_checked():
    # An older server's request parses to exactly what it did before (same fingerprint on a retry).
    assert "grace_period_s" not in parse_allocation_request(body())
    assert parse_allocation_request(body(grace_period_s=5))["grace_period_s"] == 5.0
    assert parse_allocation_request(body(grace_period_s=0))["grace_period_s"] == 0.0
    for bad, words in [(-1, "must be ≥ 0"), (3601, "must be ≤ 3600"), ("30", "expected a number, got str"),
                       (True, "expected a number, got bool")]:
        with pytest.raises(ProtocolError) as info:
            parse_allocation_request(body(grace_period_s=bad))
        assert info.value.path == "grace_period_s" and words in info.value.message, bad


def test_the_jobs_grace_replaces_the_agents_over_http(tmp_path):
    """The agent waits 30 s by default; this job asked for 0.3 s, the other one says nothing."""
    async def scenario(client, log_dir):
        short = start_body("short", STUBBORN, gpus=["GPU-aaaa"], grace_period_s=0.3)
        assert (await client.post("/v1/allocations", headers=AUTH, json=short)).status == 202
        plain = start_body("plain", STUBBORN, gpus=["GPU-bbbb"])
        assert (await client.post("/v1/allocations", headers=AUTH, json=plain)).status == 202
        await allocation_state(client, "short", until=("running",))
        await allocation_state(client, "plain", until=("running",))
        await asyncio.sleep(0.2)  # the trap is set
        await client.delete("/v1/allocations/short", headers=AUTH)
        await client.delete("/v1/allocations/plain", headers=AUTH)
        killed = await allocation_state(client, "short", until=("stopped",), timeout=10)
        assert (killed["exit_code"], killed["reason"]) == (-9, "stopped on request (SIGKILL after 0.3 s grace)")
        # The one without a grace of its own still has the agent's 30 s: it is not killed yet.
        assert (await allocation_state(client, "plain", until=("running", "stopped")))["state"] == "running"
        assert json.loads((log_dir / "allocations.json").read_text())["allocations"][0]["grace_s"] == 0.3
    serve(tmp_path, scenario, grace_s=30)


def test_a_restarted_agent_keeps_the_jobs_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher_module, "ADOPTED_POLL_S", 0.05)

    async def scenario():
        first = Launcher(tmp_path, grace_s=30)
        first.start(parse_allocation_request(body(id="long", command=STUBBORN, grace_period_s=0.2)), INVENTORY)
        for _ in range(100):
            if (tmp_path / "long.log").exists() and b"ready" in (tmp_path / "long.log").read_bytes():
                break
            await asyncio.sleep(0.05)
        await first.aclose()  # the agent goes, the work stays

        second = Launcher(tmp_path, grace_s=30)
        await second.resume()
        assert second.get("long").state == "running" and second.get("long").grace_s == 0.2
        second.stop("long")
        stopped = await second.wait("long", 10)
        assert (stopped.state, stopped.reason) == ("stopped", "stopped on request (SIGKILL after 0.2 s grace)")
        await second.aclose()

    asyncio.run(scenario())
