"""Starts, watches and stops the work the server allocates to this host.

An allocation runs its argv in its own session (so one signal reaches every process it
forks), with its output in `{log_dir}/{id}.log` and its GPUs in `CUDA_VISIBLE_DEVICES`.
GPU sharing: a request with a `share` runs on a fraction of its one GPU, which other shared
allocations may use too while their shares sum to at most 1000 (never beside a whole one);
with a MIG profile, CUDA_VISIBLE_DEVICES is a free MIG instance of that profile on the GPU.
Its life: starting -> running -> succeeded | failed (exit code) | stopped (on request).
Finished allocations stay in reports until the server acknowledges them. The list is kept
in `{log_dir}/allocations.json`, written atomically on every change, so that a restarted
agent still reports what finished while nobody was looking and recognises work that is
still running (or marks it lost).

Everything here runs on the agent's event loop: a check and the change it guards happen
with no await between them, so two requests cannot both take one GPU.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from agent.protocol import ALLOCATION_ID, FINISHED_STATES

log = logging.getLogger(__name__)

STATE_FILE = "allocations.json"
STATE_SCHEMA = "fabricpool.agent-state/1"
ACTIVE_STATES = ("starting", "running")
ID_PATTERN = ALLOCATION_ID  # one rule, in agent.protocol
MAX_ALLOCATIONS = 1024  # the protocol's limit on a report's allocations list
REMEMBER_ACKNOWLEDGED = 1000  # ids kept after an ack, so a replayed start is refused
ADOPTED_POLL_S = 1.0


class LaunchError(Exception):
    """A refused request: HTTP status, the request field at fault, and why."""

    def __init__(self, status: int, path: str, message: str):
        super().__init__(message)
        self.status = status
        self.path = path
        self.message = message


@dataclass
class Allocation:
    id: str
    gpus: list[str]
    fingerprint: str
    state: str = "starting"
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: str = ""
    pid: int | None = None
    create_time: float | None = None  # the process's start time: a reused pid is not ours
    stop_requested: bool = False
    killed: bool = False
    share_milli: int = 1000  # below 1000: a fraction of its one GPU, which others may share
    grace_s: float | None = None  # the job's SIGTERM -> SIGKILL grace; None: the agent's
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def public(self) -> dict:
        return {
            "id": self.id, "state": self.state, "exit_code": self.exit_code,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "gpus": list(self.gpus), "reason": self.reason,
        }

    def record(self) -> dict:
        return {**self.public(), "fingerprint": self.fingerprint, "pid": self.pid,
                "create_time": self.create_time, "stop_requested": self.stop_requested,
                "share_milli": self.share_milli, "grace_s": self.grace_s}


def fingerprint(request: dict) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def gpu_index(inventory: list[dict]) -> dict[str, dict]:
    """UUID (GPU or MIG instance) -> {"physical": GPU UUID, "whole": bool, "hca": str, "gpu": dict}."""
    index = {}
    for gpu in inventory:
        index[gpu["uuid"]] = {"physical": gpu["uuid"], "whole": True, "hca": gpu.get("nearest_hca") or "", "gpu": gpu}
        for mig in gpu.get("mig_instances") or []:
            index[mig["uuid"]] = {"physical": gpu["uuid"], "whole": False, "hca": gpu.get("nearest_hca") or "", "gpu": gpu}
    return index


def allocation_env(request: dict, inventory: list[dict], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an allocation: the agent's, the request's, then what the agent
    decides (GPUs, HCAs, distributed rendezvous), which the request cannot override."""
    env = dict(os.environ if base is None else base)
    env.update(request.get("env") or {})
    index = gpu_index(inventory)
    gpus = request["gpus"]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    hcas = []
    for uuid in gpus:
        hca = index.get(uuid, {}).get("hca")
        if hca and hca not in hcas:
            hcas.append(hca)
    if hcas:
        # "=" makes NCCL match names exactly: plain "mlx5_1" would also pick mlx5_10, mlx5_11...
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
    dist = request.get("distributed") or {}
    if any(value is not None for value in dist.values()):
        names = {"master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT", "world_size": "WORLD_SIZE",
                 "node_rank": "NODE_RANK", "nproc_per_node": "NPROC_PER_NODE"}
        for key, name in names.items():
            if dist.get(key) is not None:
                env[name] = str(dist[key])
        if dist.get("nproc_per_node") is None:
            env["NPROC_PER_NODE"] = str(len(gpus))
    env["FABRICPOOL_ALLOCATION_ID"] = request["id"]
    return env


def _signal_group(pgid: int | None, sig: int) -> None:
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _reap(process: subprocess.Popen, loop: asyncio.AbstractEventLoop, exited: asyncio.Future) -> None:
    code = process.wait()

    def deliver():
        if not exited.done():
            exited.set_result(code)

    with contextlib.suppress(RuntimeError):  # the loop is closed: the agent is exiting
        loop.call_soon_threadsafe(deliver)


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _still_ours(pid: int | None, create_time: float | None) -> bool:
    if not pid or create_time is None:
        return False
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - create_time) < 0.01 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Launcher:
    def __init__(self, log_dir: str | Path, *, grace_s: float = 10.0, clock: Callable[[], float] = time.time):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.log_dir / STATE_FILE
        self.grace_s = grace_s
        self._clock = clock
        self._allocations: dict[str, Allocation] = {}
        self._acknowledged: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._adopted: list[Allocation] = []
        self._load()

    # ------------------------------------------------------------ queries

    def get(self, allocation_id: str) -> Allocation | None:
        return self._allocations.get(allocation_id)

    def report(self) -> list[dict]:
        return [a.public() for a in self._allocations.values()]

    def active(self) -> list[Allocation]:
        return [a for a in self._allocations.values() if a.state in ACTIVE_STATES]

    # ------------------------------------------------------------ commands

    def start(self, request: dict, inventory: list[dict]) -> tuple[Allocation, bool]:
        """Accept a parsed allocation request (protocol.parse_allocation_request) and launch
        it in the background. Returns (allocation, created); created is False when the same
        request was already accepted. Raises LaunchError when refused: nothing is started."""
        allocation_id = request["id"]
        if not ID_PATTERN.match(allocation_id):
            raise LaunchError(400, "id", "use 1-80 letters, digits, '.', '_' and '-', starting with a letter or digit "
                                         "(it names the log file)")
        digest = fingerprint(request)
        existing = self._allocations.get(allocation_id)
        if existing is not None:
            if existing.fingerprint == digest:
                return existing, False
            raise LaunchError(409, "id", f"allocation {allocation_id} already exists with a different request")
        if allocation_id in self._acknowledged:
            raise LaunchError(409, "id", f"allocation {allocation_id} already ran here and was acknowledged")
        if len(self._allocations) >= MAX_ALLOCATIONS:
            raise LaunchError(409, "id", f"{len(self._allocations)} allocations here are not acknowledged yet; ack finished ones first")
        share = request.get("share")
        gpus = list(request["gpus"])
        if share and share.get("mig_profile"):
            gpus = [self._mig_instance(gpus[0], share["mig_profile"], inventory)]
            share = None  # a MIG instance is whole in itself
        self._check_gpus(gpus, inventory, share_milli=share["milli"] if share else 1000)

        allocation = Allocation(id=allocation_id, gpus=gpus, fingerprint=digest,
                                share_milli=share["milli"] if share else 1000,
                                grace_s=request.get("grace_period_s"))
        self._allocations[allocation_id] = allocation
        self._save()
        env = allocation_env({**request, "gpus": gpus}, inventory)
        self._spawn_task(self._run(allocation, request["command"], env))
        return allocation, True

    def _mig_instance(self, gpu_uuid: str, profile: str, inventory: list[dict]) -> str:
        """A MIG instance of `profile` on that GPU that no active allocation uses (the server
        placed a MIG profile, not a named instance)."""
        entry = gpu_index(inventory).get(gpu_uuid)
        if entry is None:
            raise LaunchError(409, "gpus[0]", f"GPU {gpu_uuid} is not on this host")
        gpu = entry["gpu"]
        if not gpu.get("mig_mode"):
            raise LaunchError(409, "share.mig_profile", f"GPU {gpu_uuid} is not in MIG mode")
        taken = {u for a in self.active() for u in a.gpus}
        for mig in gpu.get("mig_instances") or []:
            if mig.get("profile", "").lower().endswith(profile.lower()) and mig["uuid"] not in taken:
                return mig["uuid"]
        have = sorted({m.get("profile") or "?" for m in gpu.get("mig_instances") or []})
        raise LaunchError(409, "share.mig_profile", f"no free MIG instance of profile {profile} on GPU {gpu_uuid} "
                                                    f"(it has: {', '.join(have) or 'none'})")

    def _check_gpus(self, requested: list[str], inventory: list[dict], share_milli: int = 1000) -> None:
        index = gpu_index(inventory)
        seen = set()
        for i, uuid in enumerate(requested):
            where = f"gpus[{i}]"
            if uuid in seen:
                raise LaunchError(400, where, f"GPU {uuid} is listed twice")
            seen.add(uuid)
            entry = index.get(uuid)
            if entry is None:
                raise LaunchError(409, where, f"GPU {uuid} is not on this host")
            gpu = entry["gpu"]
            if gpu.get("error"):
                raise LaunchError(409, where, f"GPU {uuid} cannot be used: {gpu['error']}")
            if entry["whole"] and gpu.get("mig_mode"):
                raise LaunchError(409, where, f"GPU {uuid} is in MIG mode: allocate its MIG instances instead")
        shared_use: dict[str, int] = {}  # GPU UUID -> milli held by shared allocations
        for allocation in self.active():
            for uuid_taken in allocation.gpus:
                taken = index.get(uuid_taken, {"physical": uuid_taken, "whole": True})
                for i, uuid in enumerate(requested):
                    wanted = index[uuid]
                    if uuid == uuid_taken and share_milli < 1000 and allocation.share_milli < 1000:
                        # Both are fractions of this GPU: allowed while the shares fit.
                        shared_use[uuid] = shared_use.get(uuid, 0) + allocation.share_milli
                        if shared_use[uuid] + share_milli > 1000:
                            raise LaunchError(409, f"gpus[{i}]", f"GPU {uuid} is shared up to {shared_use[uuid]}/1000 "
                                                                 f"already; {share_milli}/1000 more does not fit")
                        continue
                    overlap = uuid == uuid_taken or (
                        wanted["physical"] == taken["physical"] and (wanted["whole"] or taken["whole"]))
                    if overlap:
                        raise LaunchError(409, f"gpus[{i}]", f"GPU {uuid} is in use by allocation {allocation.id}")

    def stop(self, allocation_id: str) -> Allocation:
        """SIGTERM to the allocation's process group now, SIGKILL after the grace period (the
        request's grace_period_s, else the agent's)."""
        allocation = self._allocations.get(allocation_id)
        if allocation is None:
            raise LaunchError(404, "id", f"no allocation {allocation_id} on this host")
        if allocation.state in FINISHED_STATES or allocation.stop_requested:
            return allocation
        allocation.stop_requested = True
        self._save()
        if allocation.pid:  # not yet spawned: _run sees the flag and never starts it
            _signal_group(allocation.pid, signal.SIGTERM)
            self._spawn_task(self._escalate(allocation))
        return allocation

    def ack(self, allocation_id: str) -> dict:
        """The server has recorded a finished allocation: forget it. Repeating an ack is fine."""
        allocation = self._allocations.get(allocation_id)
        if allocation is None:
            if allocation_id in self._acknowledged:
                return {"id": allocation_id, "acknowledged": True}
            raise LaunchError(404, "id", f"no allocation {allocation_id} on this host")
        if allocation.state not in FINISHED_STATES:
            raise LaunchError(409, "id", f"allocation {allocation_id} is still {allocation.state}; stop it first")
        del self._allocations[allocation_id]
        self._acknowledged = (self._acknowledged + [allocation_id])[-REMEMBER_ACKNOWLEDGED:]
        self._save()
        return {"id": allocation_id, "acknowledged": True}

    async def resume(self) -> None:
        """Watch the work a previous agent process left running (call once the loop runs)."""
        for allocation in self._adopted:
            self._spawn_task(self._watch_adopted(allocation))
        self._adopted = []

    async def aclose(self) -> None:
        """Stop watching (the work itself keeps running, and the next agent adopts it)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._save()

    async def wait(self, allocation_id: str, timeout: float) -> Allocation:
        """Wait until an allocation has finished (tests and the CLI)."""
        allocation = self._allocations[allocation_id]
        await asyncio.wait_for(allocation.done.wait(), timeout)
        return allocation

    # ------------------------------------------------------------ processes

    def _spawn_task(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, allocation: Allocation, argv: list[str], env: dict[str, str]) -> None:
        if allocation.stop_requested:
            self._finish(allocation, "stopped", None, "stopped on request before it started")
            return
        log_path = self.log_dir / f"{allocation.id}.log"
        try:
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            with open(fd, "wb") as output:
                # Popen, not asyncio's subprocess: a spawn is one synchronous step that a
                # shutdown cannot cut in half; a thread per allocation waits for the exit.
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._finish(allocation, "failed", None, f"could not start {argv[0]!r}: {detail}")
            return
        allocation.pid = process.pid
        allocation.create_time = _create_time(process.pid)
        allocation.started_at = self._clock()
        allocation.state = "running"
        self._save()
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        threading.Thread(target=_reap, args=(process, loop, exited), name=f"reap-{allocation.id}", daemon=True).start()
        code = await exited
        # The leader is gone; whatever it left behind in its session would keep the GPUs busy.
        _signal_group(allocation.pid, signal.SIGKILL)
        self._finished_process(allocation, code)

    def _finished_process(self, allocation: Allocation, code: int | None) -> None:
        if allocation.stop_requested:
            how = f"SIGKILL after {self._grace(allocation):g} s grace" if allocation.killed else "SIGTERM"
            self._finish(allocation, "stopped", code, f"stopped on request ({how})")
        elif code == 0:
            self._finish(allocation, "succeeded", 0, "")
        elif code is not None and code < 0:
            self._finish(allocation, "failed", code, f"killed by {signal.Signals(-code).name}")
        else:
            self._finish(allocation, "failed", code, f"exited with code {code}")

    def _grace(self, allocation: Allocation) -> float:
        return self.grace_s if allocation.grace_s is None else allocation.grace_s

    async def _escalate(self, allocation: Allocation) -> None:
        grace = self._grace(allocation)
        try:
            await asyncio.wait_for(allocation.done.wait(), grace)
        except TimeoutError:
            if allocation.pid and (allocation.create_time is None or _still_ours(allocation.pid, allocation.create_time)):
                allocation.killed = True
                log.info("allocation %s ignored SIGTERM for %s s: SIGKILL", allocation.id, grace)
                _signal_group(allocation.pid, signal.SIGKILL)

    async def _watch_adopted(self, allocation: Allocation) -> None:
        """A process we did not start in this agent: no exit code, only whether it still runs."""
        while _still_ours(allocation.pid, allocation.create_time):
            await asyncio.sleep(ADOPTED_POLL_S)
        _signal_group(allocation.pid, signal.SIGKILL)
        if allocation.stop_requested:
            self._finished_process(allocation, None)
        else:
            self._finish(allocation, "lost", None, "exit code unknown: it finished while the agent was restarting")

    def _finish(self, allocation: Allocation, state: str, code: int | None, reason: str) -> None:
        allocation.state = state
        allocation.exit_code = code
        allocation.reason = reason
        allocation.finished_at = self._clock()
        allocation.done.set()
        self._save()
        log.info("allocation %s %s%s", allocation.id, state, f": {reason}" if reason else "")

    # ------------------------------------------------------------ state file

    def _save(self) -> None:
        data = {
            "schema": STATE_SCHEMA,
            "allocations": [a.record() for a in self._allocations.values()],
            "acknowledged": self._acknowledged,
        }
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as out:
            json.dump(data, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.state_path)  # readers see the old file or the new one, never half

    def _load(self) -> None:
        if not self.state_path.exists():
            return
        try:
            data = json.loads(self.state_path.read_text())
            if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
                raise ValueError(f"not a {STATE_SCHEMA} file")
            records = data.get("allocations") or []
            acknowledged = [str(i) for i in data.get("acknowledged") or []]
            allocations = [self._from_record(r) for r in records]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            aside = self.state_path.with_name(f"{self.state_path.name}.unreadable-{int(self._clock())}")
            with contextlib.suppress(OSError):
                self.state_path.rename(aside)
            log.error("state file %s is unreadable (%s); moved to %s, starting with no allocations",
                      self.state_path, exc, aside.name)
            return
        self._acknowledged = acknowledged[-REMEMBER_ACKNOWLEDGED:]
        for allocation in allocations:
            self._allocations[allocation.id] = allocation
        self._save()

    def _from_record(self, record: dict) -> Allocation:
        allocation = Allocation(
            id=str(record["id"]), gpus=[str(g) for g in record.get("gpus") or []],
            fingerprint=str(record.get("fingerprint") or ""), state=str(record["state"]),
            exit_code=record.get("exit_code"), started_at=record.get("started_at"),
            finished_at=record.get("finished_at"), reason=str(record.get("reason") or ""),
            pid=record.get("pid"), create_time=record.get("create_time"),
            stop_requested=bool(record.get("stop_requested")),
            share_milli=int(record.get("share_milli") or 1000),
            grace_s=float(record["grace_s"]) if record.get("grace_s") is not None else None,
        )
        if allocation.state in FINISHED_STATES:
            allocation.done.set()
        elif _still_ours(allocation.pid, allocation.create_time):
            allocation.state = "running"
            self._adopted.append(allocation)
        else:
            allocation.state = "lost"
            allocation.finished_at = self._clock()
            allocation.reason = ("the agent restarted before it started" if not allocation.pid
                                 else "exit code unknown: it ended while the agent was down")
            allocation.done.set()
        return allocation
