"""GPUs through NVML (the `pynvml` module of nvidia-ml-py).

Units are converted here so that the report speaks one language: memory bytes -> MiB,
power mW -> W. Every field is read on its own: a field the GPU does not support (or that
needs root) is None, the rest of the GPU is still reported; a GPU that fell off the bus
is reported with `error` set and its numbers None, the other GPUs are unaffected.
"""
from __future__ import annotations

import logging
import math
import os

import pynvml

log = logging.getLogger(__name__)

MIB = 2**20
GIB = 2**30

_init_pid: int | None = None  # NVML handles belong to one process: init again after a fork


class NvmlUnavailable(RuntimeError):
    """No NVML here (no driver, no library): the caller falls back to nvidia-smi."""


class _GpuLost(Exception):
    def __init__(self, message: str):
        self.message = message


def init() -> None:
    """nvmlInit once per process. Raises NvmlUnavailable with NVML's reason."""
    global _init_pid
    if _init_pid == os.getpid():
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
    _init_pid = os.getpid()


def _lost_errors() -> tuple[type, ...]:
    return tuple(getattr(pynvml, name) for name in ("NVMLError_GpuIsLost", "NVMLError_ResetRequired") if hasattr(pynvml, name))


def _field(fn, *args):
    """One NVML call: its value, or None when this GPU cannot answer it. A lost GPU aborts."""
    try:
        return fn(*args)
    except _lost_errors() as exc:
        raise _GpuLost(str(exc)) from None
    except pynvml.NVMLError as exc:
        # NotSupported (MIG utilization, ECC on GeForce), NoPermission, FunctionNotFound on
        # old drivers: this field is unknown, the others are not.
        log.debug("NVML %s%r: %s", getattr(fn, "__name__", fn), args[1:], exc)
        return None


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def mig_profile(slices: int | None, memory_mib: int | None, parent_total_bytes: int | None) -> str:
    """Rebuild a MIG profile name such as "1g.10gb" from the instance's attributes.

    The memory part is the instance's share of the GPU rounded up to eighths, times the
    GPU's memory in whole GiB (the rule NVIDIA's go-nvlib uses), so 9984 MiB of an 81559 MiB
    H100 is "10gb" and 40448 MiB is "40gb"."""
    if not slices or not memory_mib:
        return ""
    if not parent_total_bytes:
        return f"{slices}g.{math.ceil(memory_mib / 1024)}gb"
    share = math.ceil(memory_mib * MIB / parent_total_bytes * 8) / 8
    total_gib = math.ceil(parent_total_bytes / GIB)
    return f"{slices}g.{round(share * total_gib)}gb"


def read_gpus() -> list[dict]:
    """Every physical GPU NVML sees, in NVML index order."""
    init()
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot count GPUs: {exc}") from None
    return [_read_gpu(index) for index in range(count)]


_known_uuids: dict[int, str] = {}  # index -> UUID, so that a GPU that is lost later keeps its identity


def _empty_gpu(index: int) -> dict:
    return {
        "index": index, "uuid": _known_uuids.get(index) or f"GPU-LOST-INDEX-{index}", "model": "",
        "memory_total_mib": None, "memory_used_mib": None, "utilization_pct": None,
        "temperature_c": None, "power_w": None, "power_limit_w": None,
        "ecc_corrected": None, "ecc_uncorrected": None, "compute_capability": "",
        "numa_node": None, "pci_bus_id": "", "nearest_hca": "", "mig_mode": False, "mig_instances": [],
    }


def _read_gpu(index: int) -> dict:
    gpu = _empty_gpu(index)
    try:
        handle = _field(pynvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            gpu["error"] = "NVML returned no handle for this GPU"
            return gpu
        uuid = _text(_field(pynvml.nvmlDeviceGetUUID, handle))
        if uuid:
            gpu["uuid"] = _known_uuids[index] = uuid
        pci = _field(pynvml.nvmlDeviceGetPciInfo, handle)  # early: it locates even a GPU that is failing
        gpu["pci_bus_id"] = _text(pci.busId) if pci is not None else ""
        gpu["model"] = _text(_field(pynvml.nvmlDeviceGetName, handle)) or ""
        memory = _field(pynvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            gpu["memory_total_mib"] = memory.total // MIB
            gpu["memory_used_mib"] = memory.used // MIB
        utilization = _field(pynvml.nvmlDeviceGetUtilizationRates, handle)
        gpu["utilization_pct"] = utilization.gpu if utilization is not None else None
        gpu["temperature_c"] = _field(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        power = _field(pynvml.nvmlDeviceGetPowerUsage, handle)
        gpu["power_w"] = power / 1000 if power is not None else None
        limit = _field(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        gpu["power_limit_w"] = limit / 1000 if limit is not None else None
        gpu["ecc_corrected"] = _field(
            pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
        gpu["ecc_uncorrected"] = _field(
            pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        capability = _field(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        gpu["compute_capability"] = f"{capability[0]}.{capability[1]}" if capability else ""
        gpu["numa_node"] = _field(pynvml.nvmlDeviceGetNumaNodeId, handle) if hasattr(pynvml, "nvmlDeviceGetNumaNodeId") else None
        mode = _field(pynvml.nvmlDeviceGetMigMode, handle)
        gpu["mig_mode"] = bool(mode and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        if gpu["mig_mode"]:
            total_bytes = memory.total if memory is not None else None
            gpu["mig_instances"] = _read_mig_instances(handle, total_bytes)
    except _GpuLost as lost:
        gpu["error"] = f"GPU {index} is lost: {lost.message}"
        log.warning("%s", gpu["error"])
    return gpu


def _read_mig_instances(handle, parent_total_bytes: int | None) -> list[dict]:
    instances = []
    slots = _field(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except _lost_errors() as exc:
            raise _GpuLost(str(exc)) from None
        except pynvml.NVMLError:
            continue  # NotFound: an empty slot
        uuid = _text(_field(pynvml.nvmlDeviceGetUUID, mig))
        if not uuid:
            continue
        attributes = _field(pynvml.nvmlDeviceGetAttributes, mig)
        memory = _field(pynvml.nvmlDeviceGetMemoryInfo, mig)
        attr_memory = attributes.memorySizeMB if attributes is not None else None
        instances.append({
            "uuid": uuid,
            "gpu_instance_id": _field(pynvml.nvmlDeviceGetGpuInstanceId, mig),
            "profile": mig_profile(attributes.gpuInstanceSliceCount if attributes is not None else None,
                                   attr_memory, parent_total_bytes),
            "memory_total_mib": memory.total // MIB if memory is not None else attr_memory,
            "memory_used_mib": memory.used // MIB if memory is not None else None,
        })
    return instances
