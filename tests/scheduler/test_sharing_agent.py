"""GPU sharing on the agent side: dispatch's `share` field, the launcher letting fractions
share one GPU up to 1000/1000 (never beside a whole allocation), and MIG profiles resolved
to a free MIG instance in CUDA_VISIBLE_DEVICES."""
from __future__ import annotations

import asyncio

import pytest

from agent.launcher import Launcher, LaunchError
from agent.protocol import ALLOCATION_SCHEMA, ProtocolError, parse_allocation_request

INVENTORY = [
    {"uuid": "GPU-a", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []},
    {"uuid": "GPU-m", "nearest_hca": "mlx5_1", "mig_mode": True,
     "mig_instances": [{"uuid": "MIG-1", "profile": "MIG 3g.40gb"}, {"uuid": "MIG-2", "profile": "MIG 3g.40gb"},
                       {"uuid": "MIG-3", "profile": "MIG 1g.10gb"}]},
]


def request(allocation_id, gpus=("GPU-a",), share=None, command=("sleep", "30")):
    body = {"schema": ALLOCATION_SCHEMA, "id": allocation_id, "command": list(command), "gpus": list(gpus)}
    if share is not None:
        body["share"] = share
    return parse_allocation_request(body)


def test_protocol_reads_the_share_and_refuses_bad_ones():
    assert request("a", share={"milli": 250, "memory_mib": 4096})["share"] == {
        "milli": 250, "memory_mib": 4096, "mig_profile": ""}
    assert "share" not in request("b")  # whole-GPU requests parse exactly as before
    with pytest.raises(ProtocolError, match="share.milli"):
        request("c", share={"milli": 1000})
    with pytest.raises(ProtocolError, match="exactly one GPU"):
        request("d", gpus=["GPU-a", "GPU-m"], share={"milli": 100})


def test_fractions_share_a_gpu_until_it_is_full_and_never_beside_a_whole_one(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.2)
        try:
            first, _ = launcher.start(request("s1", share={"milli": 600}), INVENTORY)
            second, _ = launcher.start(request("s2", share={"milli": 400}), INVENTORY)
            assert first.gpus == second.gpus == ["GPU-a"]
            with pytest.raises(LaunchError, match="shared up to 1000/1000 already"):
                launcher.start(request("s3", share={"milli": 1}), INVENTORY)
            with pytest.raises(LaunchError, match="in use by allocation s1"):
                launcher.start(request("whole"), INVENTORY)
        finally:
            for a in launcher.active():
                launcher.stop(a.id)
            await launcher.aclose()

    asyncio.run(scenario())


def test_a_whole_allocation_keeps_its_gpu_from_fractions(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.2)
        try:
            launcher.start(request("whole"), INVENTORY)
            with pytest.raises(LaunchError, match="in use by allocation whole"):
                launcher.start(request("frac", share={"milli": 100}), INVENTORY)
        finally:
            for a in launcher.active():
                launcher.stop(a.id)
            await launcher.aclose()

    asyncio.run(scenario())


def test_mig_profile_gets_a_free_instance_in_cuda_visible_devices(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.2)
        try:
            one, _ = launcher.start(request("m1", gpus=["GPU-m"], share={"milli": 428, "mig_profile": "3g.40gb"}),
                                    INVENTORY)
            two, _ = launcher.start(request("m2", gpus=["GPU-m"], share={"milli": 428, "mig_profile": "3g.40gb"}),
                                    INVENTORY)
            assert (one.gpus, two.gpus) == (["MIG-1"], ["MIG-2"])
            with pytest.raises(LaunchError, match="no free MIG instance of profile 3g.40gb"):
                launcher.start(request("m3", gpus=["GPU-m"], share={"milli": 428, "mig_profile": "3g.40gb"}),
                               INVENTORY)
            with pytest.raises(LaunchError, match="not in MIG mode"):
                launcher.start(request("m4", gpus=["GPU-a"], share={"milli": 142, "mig_profile": "1g.10gb"}), INVENTORY)
        finally:
            for a in launcher.active():
                launcher.stop(a.id)
            await launcher.aclose()

    asyncio.run(scenario())


def test_the_process_sees_only_its_mig_instance(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.2)
        out = tmp_path / "env.txt"
        cmd = ("sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {out}')
        a, _ = launcher.start(request("env", gpus=["GPU-m"], share={"milli": 142, "mig_profile": "1g.10gb"},
                                      command=cmd), INVENTORY)
        await launcher.wait(a.id, timeout=10)
        await launcher.aclose()
        return out.read_text().strip()

    assert asyncio.run(scenario()) == "MIG-3"
