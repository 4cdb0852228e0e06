"""The launcher with real processes: environment, refusals, stop, and the state file."""
from __future__ import annotations

import asyncio
import json
import stat

import psutil
import pytest

from agent import launcher as launcher_module
from agent.launcher import Launcher, LaunchError, allocation_env
from agent.protocol import ALLOCATION_SCHEMA, parse_allocation_request

INVENTORY = [
    {"uuid": "GPU-a", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []},
    {"uuid": "GPU-b", "nearest_hca": "mlx5_0", "mig_mode": False, "mig_instances": []},
    {"uuid": "GPU-c", "nearest_hca": "mlx5_1", "mig_mode": False, "mig_instances": []},
    {"uuid": "GPU-m", "nearest_hca": "mlx5_2", "mig_mode": True,
     "mig_instances": [{"uuid": "MIG-m1"}, {"uuid": "MIG-m2"}]},
    {"uuid": "GPU-x", "nearest_hca": "", "mig_mode": False, "mig_instances": [], "error": "GPU 4 is lost: GPU is lost"},
]


def request(allocation_id="job-1", gpus=("GPU-a",), command=("sh", "-c", "exit 0"), **extra):
    return parse_allocation_request({
        "schema": ALLOCATION_SCHEMA, "id": allocation_id, "command": list(command), "gpus": list(gpus), **extra})


def run(coroutine):
    return asyncio.run(coroutine)


async def gone(pid: int, within: float = 2.0) -> bool:
    """The process has ended (a zombie nobody reaped has ended too)."""
    for _ in range(int(within / 0.02)):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.02)
    return False


# ----------------------------------------------------------------- environment


def test_env_names_the_gpus_their_hcas_and_the_rendezvous():
    env = allocation_env(
        request(gpus=["GPU-c", "GPU-a", "GPU-b"], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "MY_FLAG": "1"},
                distributed={"master_addr": "gpu001", "master_port": 29500, "world_size": 16, "node_rank": 1}),
        INVENTORY, base={"PATH": "/usr/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-a,GPU-b"  # the request cannot widen its GPUs
    assert env["NCCL_IB_HCA"] == "=mlx5_1,mlx5_0"  # distinct, in GPU order, matched exactly
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["NODE_RANK"]) == ("gpu001", "29500", "16", "1")
    assert env["NPROC_PER_NODE"] == "3"  # not given: one process per GPU
    assert env["MY_FLAG"] == "1" and env["PATH"] == "/usr/bin"
    assert env["FABRICPOOL_ALLOCATION_ID"] == "job-1"


def test_single_host_work_gets_no_rendezvous_and_mig_gets_its_parents_hca():
    env = allocation_env(request(gpus=["MIG-m2"]), INVENTORY, base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-m2"
    assert env["NCCL_IB_HCA"] == "=mlx5_2"
    assert not {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "NPROC_PER_NODE"} & set(env)


def test_no_known_hca_leaves_nccl_to_choose():
    env = allocation_env(request(gpus=["GPU-a"]), [{"uuid": "GPU-a", "nearest_hca": ""}], base={})
    assert "NCCL_IB_HCA" not in env


# ----------------------------------------------------------------- refusals


def test_refusals_name_the_field_and_start_nothing(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.5)
        busy, _ = launcher.start(request("busy", gpus=["GPU-a", "MIG-m1"], command=["sleep", "30"]), INVENTORY)
        await asyncio.sleep(0.1)
        assert busy.state == "running"
        cases = [
            (request("j1", gpus=["GPU-zzz"]), 409, "gpus[0]", "GPU GPU-zzz is not on this host"),
            (request("j2", gpus=["GPU-b", "GPU-a"]), 409, "gpus[1]", "GPU GPU-a is in use by allocation busy"),
            (request("j3", gpus=["MIG-m1"]), 409, "gpus[0]", "in use by allocation busy"),
            (request("j4", gpus=["GPU-m"]), 409, "gpus[0]", "is in MIG mode: allocate its MIG instances instead"),
            (request("j5", gpus=["GPU-x"]), 409, "gpus[0]", "cannot be used: GPU 4 is lost"),
            (request("j6", gpus=["GPU-b", "GPU-b"]), 400, "gpus[1]", "listed twice"),
            ({**request("j7"), "id": "../../etc/x"}, 400, "id", "names the log file"),  # past the protocol check
            (request("busy", gpus=["GPU-c"]), 409, "id", "already exists with a different request"),
        ]
        for req, status, path, message in cases:
            with pytest.raises(LaunchError) as refused:
                launcher.start(req, INVENTORY)
            assert (refused.value.status, refused.value.path) == (status, path), req["id"]
            assert message in refused.value.message
        assert [a["id"] for a in launcher.report()] == ["busy"]
        assert sorted(p.name for p in tmp_path.glob("*.log")) == ["busy.log"]

        # another instance of the same MIG GPU is free; the same request again is not a second job
        other, created = launcher.start(request("j7", gpus=["MIG-m2"]), INVENTORY)
        assert created
        again, created = launcher.start(request("busy", gpus=["GPU-a", "MIG-m1"], command=["sleep", "30"]), INVENTORY)
        assert again is busy and not created
        launcher.stop("busy")
        await launcher.wait("busy", 5)
        await launcher.wait("j7", 5)
        # the GPUs of finished work are free again
        launcher.start(request("j8", gpus=["GPU-a"]), INVENTORY)
        await launcher.wait("j8", 5)
        await launcher.aclose()

    run(scenario())


# ----------------------------------------------------------------- running and stopping


def test_exit_codes_and_start_failures(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path)
        launcher.start(request("ok", gpus=["GPU-a"], command=["sh", "-c", "echo out; echo err >&2"]), INVENTORY)
        launcher.start(request("bad", gpus=["GPU-b"], command=["sh", "-c", "exit 3"]), INVENTORY)
        launcher.start(request("nope", gpus=["GPU-c"], command=["/nonexistent/trainer"]), INVENTORY)
        ok, bad, nope = [await launcher.wait(i, 5) for i in ("ok", "bad", "nope")]
        assert (ok.state, ok.exit_code, ok.reason) == ("succeeded", 0, "")
        assert ok.started_at <= ok.finished_at
        assert (tmp_path / "ok.log").read_text().splitlines() == ["out", "err"]  # stdout and stderr, one file
        assert (bad.state, bad.exit_code, bad.reason) == ("failed", 3, "exited with code 3")
        assert nope.state == "failed" and "could not start '/nonexistent/trainer'" in nope.reason
        await launcher.aclose()

    run(scenario())


def test_stop_terms_the_whole_group_then_kills_after_the_grace(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.5)
        # a job that forks: the child must die with it
        forks = f"sleep 60 & echo $! > {tmp_path}/child.pid; wait"
        launcher.start(request("polite", gpus=["GPU-a"], command=["sh", "-c", forks]), INVENTORY)
        launcher.start(request("stubborn", gpus=["GPU-b"], command=["sh", "-c", "trap '' TERM; echo ready; sleep 60"]), INVENTORY)
        await asyncio.sleep(0.3)
        loop = asyncio.get_running_loop()
        began = loop.time()
        launcher.stop("polite")
        launcher.stop("stubborn")
        polite = await launcher.wait("polite", 5)
        polite_s = loop.time() - began
        stubborn = await launcher.wait("stubborn", 5)
        stubborn_s = loop.time() - began
        assert (polite.state, polite.reason) == ("stopped", "stopped on request (SIGTERM)")
        assert polite_s < 0.4
        assert (stubborn.state, stubborn.exit_code) == ("stopped", -9)
        assert stubborn.reason == "stopped on request (SIGKILL after 0.5 s grace)"
        assert 0.5 <= stubborn_s < 2
        child = int((tmp_path / "child.pid").read_text())
        assert await gone(child)
        assert launcher.stop("polite") is polite  # stopping finished work is a no-op
        await launcher.aclose()

    run(scenario())


# ----------------------------------------------------------------- state file


def test_finished_work_survives_a_restart_until_acknowledged(tmp_path):
    async def first_agent():
        launcher = Launcher(tmp_path)
        launcher.start(request("done", command=["sh", "-c", "exit 4"]), INVENTORY)
        await launcher.wait("done", 5)
        with pytest.raises(LaunchError, match="no allocation ghost"):
            launcher.ack("ghost")
        await launcher.aclose()

    run(first_agent())
    state = tmp_path / "allocations.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".allocations.json.*"))  # no temporary file left behind

    async def second_agent():
        launcher = Launcher(tmp_path)
        [done] = launcher.report()
        assert (done["id"], done["state"], done["exit_code"]) == ("done", "failed", 4)
        assert launcher.ack("done") == {"id": "done", "acknowledged": True}
        assert launcher.ack("done") == {"id": "done", "acknowledged": True}  # a repeated ack is fine
        assert launcher.report() == []

    run(second_agent())

    async def third_agent():
        launcher = Launcher(tmp_path)
        assert launcher.report() == []
        with pytest.raises(LaunchError, match="already ran here and was acknowledged"):
            launcher.start(request("done", command=["sh", "-c", "exit 4"]), INVENTORY)

    run(third_agent())


def test_ack_of_running_work_is_refused(tmp_path):
    async def scenario():
        launcher = Launcher(tmp_path, grace_s=0.2)
        launcher.start(request("long", command=["sleep", "30"]), INVENTORY)
        with pytest.raises(LaunchError, match="still starting|still running") as refused:
            launcher.ack("long")
        assert refused.value.status == 409
        launcher.stop("long")
        await launcher.wait("long", 5)
        await launcher.aclose()

    run(scenario())


def test_a_restarted_agent_adopts_running_work_and_marks_vanished_work_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher_module, "ADOPTED_POLL_S", 0.05)

    async def scenario():
        first = Launcher(tmp_path, grace_s=0.5)
        first.start(request("long", gpus=["GPU-a"], command=["sleep", "30"]), INVENTORY)
        await asyncio.sleep(0.2)
        assert first.get("long").state == "running"
        # the agent dies (its watcher goes), the job does not; a new agent reads the state file
        await first.aclose()
        data = json.loads((tmp_path / "allocations.json").read_text())
        data["allocations"].append({"id": "vanished", "state": "running", "gpus": ["GPU-b"], "pid": 999999999, "create_time": 1.0})
        (tmp_path / "allocations.json").write_text(json.dumps(data))

        second = Launcher(tmp_path, grace_s=0.5)
        await second.resume()
        long, vanished = second.get("long"), second.get("vanished")
        assert long.state == "running"
        assert (vanished.state, vanished.reason) == ("lost", "exit code unknown: it ended while the agent was down")
        with pytest.raises(LaunchError, match="in use by allocation long"):
            second.start(request("next", gpus=["GPU-a"]), INVENTORY)
        second.stop("long")
        await second.wait("long", 5)
        assert long.state == "stopped"
        await second.aclose()

    run(scenario())


def test_an_unreadable_state_file_is_moved_aside(tmp_path, caplog):
    (tmp_path / "allocations.json").write_text("{not json")
    launcher = Launcher(tmp_path)
    assert launcher.report() == []
    assert list(tmp_path.glob("allocations.json.unreadable-*"))
    assert "is unreadable" in caplog.text
