"""How a simulated GPU host behaves: the model behind `python -m agent simulate`.

A host is computed lazily from the time it is asked about, never ticked in a loop: a
cluster of 4,096 idle hosts costs nothing between polls. What changes a host's course are
events at known times (an allocation starts running, finishes, is stopped); `advance(now)`
applies the events due since the last call in time order, integrating IB counters and the
lagging temperature and power levels exactly up to each one. The numbers therefore depend
only on the seed, the clock and the requests, not on how often anyone polls.

Noise comes from a hash of (seed, host, GPU, time bucket), not from a random generator's
state, for the same reason. Idle and busy levels follow real captures of an H100 and an
H200 (../shared/samples/telemetry/nvidia-smi): ~70 W and 30-40 °C idle, ~630 W and
~64 °C at 100 % utilization, 700 W limit.

Pure Python, no Django; only the simulator imports it.
"""
from __future__ import annotations

import json
import math
import uuid
import zlib
from dataclasses import dataclass

from . import __version__
from .protocol import ALLOCATION_ID, REPORT_SCHEMA

AGENT_VERSION = f"{__version__}+sim"

# The same names as pool.services.synthetic_gpu_uuid (which needs Django): a simulated host
# reports the GPU UUIDs build_fattree registered, so its reports update those GPU rows.
GPU_UUID_NAMESPACE = uuid.UUID("6f1c3c1e-6a53-4f43-9f0e-8a2b1c7d5e90")


def synthetic_gpu_uuid(host_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(GPU_UUID_NAMESPACE, f'{host_name}/{index}')}"


# -- what a host is made of ---------------------------------------------------------------------

@dataclass(frozen=True)
class GpuSpec:
    index: int
    uuid: str
    model: str
    memory_mib: int
    nearest_hca: str = ""


@dataclass(frozen=True)
class HcaSpec:
    device: str  # mlx5_0
    node_guid: str = ""  # as the agent reports it: 0x0c42a10300044e32
    lid: int | None = None
    rate_gbps: float = 400.0  # 4x NDR


@dataclass(frozen=True)
class HostSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    hcas: tuple[HcaSpec, ...]
    cpu_count: int = 112  # two 56-core sockets, as on an HGX H100 host
    memory_mib: int = 2_063_731  # 2 TiB less what the firmware keeps


def agent_guid(value: int) -> str:
    """A GUID as the agent reports it (agent.sysfs.parse_guid): `0x` and 16 hex digits."""
    return f"0x{value & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def default_hca_guid(host: str, device: str) -> str:
    """A stable made-up GUID (Mellanox OUI 0c:42:a1) for hosts given without one."""
    return agent_guid(0x0C42A1 << 40 | zlib.crc32(f"{host} {device}".encode()) << 8)


# -- profiles -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuProfile:
    memory_mib: int
    idle_w: float
    busy_w: float  # at full load, a little under the limit
    limit_w: float
    idle_c: float
    busy_c: float
    compute_capability: str


GPU_PROFILES = {  # matched by substring of the model name, first match wins
    "H200": GpuProfile(143771, 77, 630, 700, 28, 62, "9.0"),
    "H100": GpuProfile(81559, 70, 632, 700, 31, 64, "9.0"),
    "A100": GpuProfile(81920, 55, 360, 400, 32, 62, "8.0"),
    "L40S": GpuProfile(46068, 35, 300, 350, 30, 70, "8.9"),
}
DEFAULT_GPU_PROFILE = GPU_PROFILES["H100"]


def gpu_profile(model: str) -> GpuProfile:
    for key, profile in GPU_PROFILES.items():
        if key in model:
            return profile
    return DEFAULT_GPU_PROFILE


@dataclass(frozen=True)
class Workload:
    util: tuple[float, float]  # utilization % range while running
    burst_s: float  # how long one utilization level lasts
    dip: float  # chance per burst of a dip (checkpoint, data stall, quiet traffic)
    dip_util: tuple[float, float]
    memory: float  # fraction of GPU memory in use
    heat: float  # 0..1: where power and temperature settle between idle and busy
    ib_multi: float  # fraction of IB line rate per HCA in a multi-host job
    ib_single: float  # ... in a single-host job (storage, checkpoints)
    fails: bool = False


WORKLOADS = {
    "training": Workload((90, 100), 1, 0.03, (0, 30), 0.86, 0.95, 0.60, 0.01),
    "inference": Workload((30, 70), 2, 0.25, (5, 20), 0.55, 0.50, 0.05, 0.02),
    "simulation": Workload((70, 88), 5, 0.02, (40, 60), 0.35, 0.80, 0.25, 0.005),
    "idle": Workload((0, 2), 5, 0.0, (0, 0), 0.20, 0.03, 0.0, 0.0),  # GPUs held, nothing run
    "failing": Workload((90, 100), 1, 0.03, (0, 30), 0.86, 0.95, 0.60, 0.01, fails=True),
}
DEFAULT_WORKLOAD = "training"

POWER_TAU_S = 3.0  # power follows load within seconds
TEMPERATURE_TAU_S = 40.0  # the heatsink takes about a minute
IDLE_IB_BYTES_PER_S = 20_000.0  # subnet management and IPoIB chatter
BULK_PACKET_BYTES = 4096.0  # MTU-sized RDMA packets
SMALL_PACKET_BYTES = 300.0
XMIT_WAIT_PER_BYTE = 1e-4  # congestion ticks per byte under all-reduce load
SIGTERM_EXIT = -15  # what a process killed by SIGTERM returns, as the real agent reports it
ID_PATTERN = ALLOCATION_ID  # one rule, in agent.protocol
REMEMBER_ACKNOWLEDGED = 1000


# -- deterministic noise --------------------------------------------------------------------

_M64 = 0xFFFF_FFFF_FFFF_FFFF


def mix(x: int) -> int:
    """splitmix64 finaliser: a good 64-bit hash of an integer, stable across runs."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def noise(key: int, bucket: int, channel: int = 0) -> float:
    """Uniform in [0, 1), a pure function of its arguments."""
    return mix(key + bucket * 0x632BE59BD9B4E019 + channel * 0x8CB92BA72F3D8DD7) / 18446744073709551616.0


def key_of(seed: int, text: str) -> int:
    return mix(seed * 0x100000001B3 + zlib.crc32(text.encode()))


# -- allocations ----------------------------------------------------------------------------

@dataclass
class Allocation:
    id: str
    workload: str
    profile: Workload
    gpu_indexes: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    multi_host: bool
    requested_at: float
    running_at: float
    end_at: float  # when it would finish by itself
    exit_code: int  # how it ends by itself
    key: int
    rate_factor: float  # this job's share of the line rate it is allowed to use
    fingerprint: str  # the request, to tell a retry from a different request with the same id
    stop_at: float | None = None  # when it dies after a DELETE

    @property
    def finish_at(self) -> float:
        return self.end_at if self.stop_at is None else min(self.end_at, self.stop_at)

    def stopped(self) -> bool:
        return self.stop_at is not None and self.stop_at < self.end_at

    def state(self, now: float) -> str:
        if now >= self.finish_at:
            if self.stopped():
                return "stopped"
            return "succeeded" if self.exit_code == 0 else "failed"
        return "running" if now >= self.running_at else "starting"

    def running(self, t: float) -> bool:
        return self.running_at <= t < self.finish_at

    def to_report(self, now: float) -> dict:
        state = self.state(now)
        finished = now >= self.finish_at
        if not finished:
            exit_code, reason = None, ""
        elif self.stopped() and self.stop_at <= self.running_at:
            exit_code, reason = None, "stopped on request before it started"
        elif self.stopped():
            exit_code, reason = SIGTERM_EXIT, "stopped on request (SIGTERM)"
        else:
            exit_code = self.exit_code
            reason = "" if exit_code == 0 else f"exited with code {exit_code}"
        return {
            "id": self.id,
            "state": state,
            "exit_code": exit_code,
            "started_at": round(self.running_at, 3) if now >= self.running_at and self.running_at < self.finish_at else None,
            "finished_at": round(self.finish_at, 3) if finished else None,
            "gpus": list(self.gpu_uuids),
            "reason": reason,
        }


class AllocationError(Exception):
    """A request this host refuses: `status` is the HTTP status, `path` the field."""

    def __init__(self, status: int, message: str, path: str = ""):
        super().__init__(message)
        self.status, self.message, self.path = status, message, path


# -- one host ---------------------------------------------------------------------------------

@dataclass
class _Port:
    spec: HcaSpec
    line_bytes: float  # bytes/s at line rate
    tx: float = 0.0
    rx: float = 0.0
    tx_packets: float = 0.0
    rx_packets: float = 0.0
    xmit_wait: float = 0.0
    rate: float = IDLE_IB_BYTES_PER_S  # bytes/s each way, bulk included
    bulk: float = 0.0  # the part of `rate` that is job traffic
    link_downed: int = 0
    flap: tuple[float, float] | None = None  # (since, period_s)


@dataclass
class _Gpu:
    spec: GpuSpec
    profile: GpuProfile
    key: int
    static: dict  # the report fields that never change
    offset_c: float  # some GPUs run warmer than others
    power_level: float = 0.0
    temp_level: float = 0.0
    target: float = 0.0  # heat the levels move towards
    alloc: Allocation | None = None  # running on it now
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0


class SimHost:
    def __init__(self, spec: HostSpec, *, seed: int = 0, now: float = 0.0, failure_rate: float = 0.0,
                 startup_s: float = 1.0, stop_grace_s: float = 1.0):
        self.spec = spec
        self.name = spec.name
        self.seed = seed
        self.key = key_of(seed, spec.name)
        self.failure_rate = failure_rate
        self.startup_s = startup_s
        self.stop_grace_s = stop_grace_s
        self.t_ref = now
        self.allocations: dict[str, Allocation] = {}  # not yet acknowledged
        self.acknowledged: dict[str, None] = {}  # the latest acknowledged ids, oldest first
        self.faults: dict[str, dict] = {}  # kind -> params (the simulator's control endpoint sets them)
        self.gpus = [self._gpu(g) for g in spec.gpus]
        self.by_uuid = {g.spec.uuid: g for g in self.gpus}
        self.ports = [_Port(h, h.rate_gbps * 1e9 / 8) for h in spec.hcas]
        # Uptime so far: counters of a host that has been up for a while are not zero.
        for i, port in enumerate(self.ports):
            start = (1 + noise(self.key, 0, 50 + i)) * 3e12
            port.tx, port.rx = start, start * (0.97 + 0.06 * noise(self.key, 0, 60 + i))
            port.tx_packets, port.rx_packets = port.tx / 2000, port.rx / 2000
            port.xmit_wait = start * XMIT_WAIT_PER_BYTE * 0.2
        self._retarget(now)

    def _gpu(self, spec: GpuSpec) -> _Gpu:
        profile = gpu_profile(spec.model)
        key = mix(self.key + spec.index + 1)
        numa = 0 if spec.index < max(1, len(self.spec.gpus)) / 2 else 1
        static = {
            "index": spec.index,
            "uuid": spec.uuid,
            "model": spec.model,
            "memory_total_mib": spec.memory_mib,
            "power_limit_w": float(profile.limit_w),
            "compute_capability": profile.compute_capability,
            "numa_node": numa,
            "pci_bus_id": _pci_bus_id(spec.index),
            "nearest_hca": spec.nearest_hca,
            "mig_mode": False,
            "mig_instances": [],
        }
        return _Gpu(spec, profile, key, static, offset_c=4 * noise(key, 0, 99))

    # -- time ---------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Bring levels and counters to `now`, applying the start and end of every allocation
        in between at its own time."""
        if now <= self.t_ref:
            return
        events = sorted({t for a in self.allocations.values() for t in (a.running_at, a.finish_at) if self.t_ref < t <= now})
        for t in events:
            self._integrate(t)
            self._retarget(t)
        self._integrate(now)

    def _integrate(self, t: float) -> None:
        dt = t - self.t_ref
        if dt <= 0:
            return
        for port in self.ports:
            if port.flap is not None:  # no traffic while the port is down: count half the time
                moved = port.rate * dt * 0.5
            else:
                moved = port.rate * dt
            bulk = port.bulk * dt * (0.5 if port.flap is not None else 1.0)
            small = moved - bulk
            port.tx += moved
            port.rx += moved * 0.995  # all-reduce is symmetric; a little less comes back
            packets = bulk / BULK_PACKET_BYTES + small / SMALL_PACKET_BYTES
            port.tx_packets += packets
            port.rx_packets += packets * 0.995
            port.xmit_wait += bulk * XMIT_WAIT_PER_BYTE
        fast, slow = math.exp(-dt / POWER_TAU_S), math.exp(-dt / TEMPERATURE_TAU_S)
        for gpu in self.gpus:
            if gpu.power_level != gpu.target or gpu.temp_level != gpu.target:
                gpu.power_level = gpu.target + (gpu.power_level - gpu.target) * fast
                gpu.temp_level = gpu.target + (gpu.temp_level - gpu.target) * slow
                if abs(gpu.power_level - gpu.target) < 1e-4 and abs(gpu.temp_level - gpu.target) < 1e-4:
                    gpu.power_level = gpu.temp_level = gpu.target
        self.t_ref = t

    def _retarget(self, t: float) -> None:
        """What each GPU and port does from time `t` on, given the allocations running then."""
        for gpu in self.gpus:
            gpu.alloc, gpu.target = None, 0.0
        bulk = [0.0] * len(self.ports)
        hca_index = {p.spec.device: i for i, p in enumerate(self.ports)}
        for alloc in self.allocations.values():
            if not alloc.running(t):
                continue
            share = alloc.profile.ib_multi if alloc.multi_host else alloc.profile.ib_single
            for index in alloc.gpu_indexes:
                gpu = self.gpus[index]
                gpu.alloc, gpu.target = alloc, alloc.profile.heat
                if not self.ports:
                    continue
                # Each GPU talks through its nearest HCA; one without a known HCA spreads over all.
                port_i = hca_index.get(gpu.spec.nearest_hca)
                targets = [port_i] if port_i is not None else range(len(self.ports))
                gpus_per_port = max(1, len(self.gpus) / len(self.ports))
                for i in targets:
                    bulk[i] += self.ports[i].line_bytes * share * alloc.rate_factor / gpus_per_port / len(targets)
        for port, b in zip(self.ports, bulk):
            port.bulk = min(b, port.line_bytes * 0.97)
            port.rate = IDLE_IB_BYTES_PER_S + port.bulk

    # -- requests -------------------------------------------------------------------------------

    def start(self, request: dict, now: float, default_duration: float) -> tuple[Allocation, bool]:
        """Start work as the agent would (`request` as protocol.parse_allocation_request
        returns it). Returns (allocation, created): a retried request starts nothing new.
        Raises AllocationError (status and message as the real agent's) when refused."""
        self.advance(now)
        alloc_id = request["id"]
        if not ID_PATTERN.match(alloc_id):
            raise AllocationError(400, "use letters, digits, '.', '_' and '-', 1-80 characters, not starting with a symbol", "id")
        fingerprint = json.dumps(request, sort_keys=True)
        existing = self.allocations.get(alloc_id)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise AllocationError(409, f"allocation {alloc_id} already exists with a different request", "id")
            return existing, False
        if alloc_id in self.acknowledged:
            raise AllocationError(409, f"allocation {alloc_id} already ran here and was acknowledged", "id")
        indexes = []
        for i, ref in enumerate(request["gpus"]):
            gpu = self.by_uuid.get(ref)
            if gpu is None:
                raise AllocationError(409, f"GPU {ref} is not on this host", f"gpus[{i}]")
            if gpu.spec.index in indexes:
                raise AllocationError(400, f"GPU {ref} is listed twice", f"gpus[{i}]")
            for other in self.allocations.values():
                if gpu.spec.uuid in other.gpu_uuids and now < other.finish_at:
                    raise AllocationError(409, f"GPU {ref} is in use by allocation {other.id}", f"gpus[{i}]")
            indexes.append(gpu.spec.index)
        name = request.get("workload") or DEFAULT_WORKLOAD
        profile = WORKLOADS.get(name, WORKLOADS[DEFAULT_WORKLOAD])
        duration = request.get("duration_s")
        duration = default_duration if duration is None else duration
        key = key_of(self.seed, f"{self.name}/{alloc_id}")
        fails = profile.fails or noise(key, 0, 1) < self.failure_rate
        world = (request.get("distributed") or {}).get("world_size") or 1
        alloc = Allocation(
            id=alloc_id, workload=name, profile=profile, gpu_indexes=tuple(indexes),
            gpu_uuids=tuple(request["gpus"]), multi_host=world > 1, requested_at=now,
            running_at=now + min(self.startup_s, duration / 4), end_at=now + duration,
            exit_code=1 if fails else 0, key=key, rate_factor=0.85 + 0.15 * noise(key, 0, 2), fingerprint=fingerprint,
        )
        self.allocations[alloc_id] = alloc
        return alloc, True

    def stop(self, alloc_id: str, now: float) -> Allocation | None:
        """SIGTERM: the work ends `stop_grace_s` later (sooner if it would end by itself)."""
        self.advance(now)
        alloc = self.allocations.get(alloc_id)
        if alloc is not None and now < alloc.finish_at and alloc.stop_at is None:
            # Work still loading never runs; running work gets its grace period.
            alloc.stop_at = now if now < alloc.running_at else now + self.stop_grace_s
        return alloc

    def ack(self, alloc_id: str, now: float) -> bool:
        """Forget a finished allocation; False if it was never here. Repeating an ack is
        fine. Raises AllocationError while it still runs."""
        self.advance(now)
        alloc = self.allocations.get(alloc_id)
        if alloc is None:
            return alloc_id in self.acknowledged
        if now < alloc.finish_at:
            raise AllocationError(409, f"allocation {alloc_id} is still {alloc.state(now)}; stop it first", "id")
        del self.allocations[alloc_id]
        self.acknowledged[alloc_id] = None
        if len(self.acknowledged) > REMEMBER_ACKNOWLEDGED:
            del self.acknowledged[next(iter(self.acknowledged))]
        return True

    # -- faults that show in the report ----------------------------------------------------

    def add_ecc(self, gpu_index: int, uncorrected: int, corrected: int) -> None:
        gpu = self.gpus[gpu_index]
        gpu.ecc_uncorrected += uncorrected
        gpu.ecc_corrected += corrected

    def flap(self, port_index: int, period_s: float, now: float) -> None:
        self.advance(now)
        port = self.ports[port_index]
        self._end_flap(port, now)
        port.flap = (now, period_s)

    def clear(self, now: float) -> None:
        """Back to health: ports stop flapping (the link_downed count they earned stays, as
        on a real port) and ECC counts go back to zero, as after a GPU reset."""
        self.advance(now)
        for port in self.ports:
            self._end_flap(port, now)
        for gpu in self.gpus:
            gpu.ecc_uncorrected = gpu.ecc_corrected = 0
        self.faults.clear()

    @staticmethod
    def _flap_cycles(port: _Port, now: float) -> int:
        since, period = port.flap
        return int((now - since) / period)

    def _end_flap(self, port: _Port, now: float) -> None:
        if port.flap is not None:
            port.link_downed += self._flap_cycles(port, now) // 2 + 1
            port.flap = None

    # -- the report ---------------------------------------------------------------------------

    def report(self, now: float) -> dict:
        self.advance(now)
        busy = 0.0
        gpus = []
        for gpu in self.gpus:
            g = dict(gpu.static)
            profile, alloc = gpu.profile, gpu.alloc
            if alloc is not None:
                w = alloc.profile
                busy += w.heat
                bucket = int(now / w.burst_s)
                if noise(alloc.key, bucket, 3) < w.dip:  # the whole job dips together
                    lo, hi = w.dip_util
                else:
                    lo, hi = w.util
                util = lo + (hi - lo) * noise(gpu.key, bucket, 1)
                ramp = min(1.0, (now - alloc.running_at) / 5.0)  # memory fills as the job loads
                memory = gpu.spec.memory_mib * w.memory * ramp * (0.98 + 0.02 * noise(gpu.key, bucket, 2)) + 500
            else:
                bucket = int(now / 5)
                util = 1 + 2 * noise(gpu.key, bucket, 1) if noise(gpu.key, bucket, 4) < 0.08 else 0.0
                memory = 500.0 if self.allocations and self._starting_on(gpu, now) else 0.0  # a loading job's CUDA context
            bucket = int(now)
            level = gpu.power_level
            power = profile.idle_w + (profile.busy_w - profile.idle_w) * level + (2 + 12 * level) * (noise(gpu.key, bucket, 5) - 0.5)
            temp = profile.idle_c + gpu.offset_c + (profile.busy_c - profile.idle_c) * gpu.temp_level + (noise(gpu.key, bucket, 6) - 0.5)
            g["memory_used_mib"] = int(min(memory, gpu.spec.memory_mib))
            g["utilization_pct"] = round(min(util, 100.0))
            g["temperature_c"] = round(temp)
            g["power_w"] = round(min(max(power, 0.0), profile.limit_w), 2)
            g["ecc_corrected"] = gpu.ecc_corrected
            g["ecc_uncorrected"] = gpu.ecc_uncorrected
            gpus.append(g)
        load = busy / len(self.gpus) if self.gpus else 0.0
        spec = self.spec
        bucket = int(now / 2)
        cpu = min(100.0, 1.5 + 30 * load + 2 * noise(self.key, bucket, 7))
        return {
            "schema": REPORT_SCHEMA,
            "host": self.name,
            "agent_version": AGENT_VERSION,
            "time": round(now, 3),
            "cpu": {"percent": round(cpu, 1), "count": spec.cpu_count,
                    "load1": round(spec.cpu_count * cpu / 100 * (0.9 + 0.2 * noise(self.key, bucket, 8)), 2)},
            "memory": {"total_mib": spec.memory_mib,
                       "used_mib": int(spec.memory_mib * (0.012 + 0.4 * load + 0.003 * noise(self.key, bucket, 9)))},
            "gpus": gpus,
            "ib_ports": [self._port_report(p, now) for p in self.ports],
            "allocations": [a.to_report(now) for a in self.allocations.values()],
        }

    def _starting_on(self, gpu: _Gpu, now: float) -> bool:
        return any(gpu.spec.uuid in a.gpu_uuids and now < min(a.running_at, a.finish_at) for a in self.allocations.values())

    def _port_report(self, port: _Port, now: float) -> dict:
        spec = port.spec
        down, downed = False, port.link_downed
        if port.flap is not None:
            cycles = self._flap_cycles(port, now)
            down, downed = cycles % 2 == 0, downed + cycles // 2 + 1  # goes down at once, then toggles
        return {
            "device": spec.device,
            "port": 1,
            "node_guid": spec.node_guid,
            "state": "DOWN" if down else "ACTIVE",
            "phys_state": "Polling" if down else "LinkUp",
            "rate_gbps": spec.rate_gbps,
            "link_layer": "InfiniBand",
            "lid": spec.lid,
            "counters": {
                "port_xmit_data_bytes": int(port.tx),
                "port_rcv_data_bytes": int(port.rx),
                "port_xmit_packets": int(port.tx_packets),
                "port_rcv_packets": int(port.rx_packets),
                "port_xmit_wait": int(port.xmit_wait),
                "symbol_error": downed * 3,  # a flapping link also corrupts symbols
                "link_downed": downed,
                "link_error_recovery": downed,
                "port_rcv_errors": 0,
                "port_xmit_discards": 0,
            },
        }


_HGX_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # an HGX H100 baseboard


def _pci_bus_id(index: int) -> str:
    bus = _HGX_BUS[index] if index < len(_HGX_BUS) else f"{0xE0 + index % 32:02x}"
    return f"00000000:{bus.upper()}:00.0"
