"""Builds the report that `GET /v1/report` returns (schema in docs/agent-protocol.md).

The readers are injectable so that tests (and the simulator) can feed their own GPUs,
ports and host figures; the default ones read NVML (or nvidia-smi) and sysfs.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from agent import __version__, hostinfo, nvidia_smi, nvml, sysfs
from agent.protocol import REPORT_SCHEMA

log = logging.getLogger(__name__)

MAX_GPUS = 64  # the protocol's limits on list lengths
MAX_IB_PORTS = 64
GPU_SOURCES = ("auto", "nvml", "nvidia-smi", "none")


class GpuReadError(RuntimeError):
    """The GPUs could not be read at all (as opposed to one field or one GPU)."""


class Collector:
    def __init__(
        self,
        host_name: str,
        *,
        sysfs_root: str | Path = "/sys",
        gpu_source: str = "auto",
        read_gpus: Callable[[], list[dict]] | None = None,
        read_ib_ports: Callable[[], list[dict]] | None = None,
        read_host: Callable[[], dict] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        if gpu_source not in GPU_SOURCES:
            raise ValueError(f"gpu source must be one of {', '.join(GPU_SOURCES)}; got {gpu_source!r}")
        self.host_name = host_name
        self.sysfs_root = Path(sysfs_root)
        self.gpu_source = gpu_source
        self._read_gpus = read_gpus
        self._read_ib_ports = read_ib_ports or (lambda: sysfs.read_ib_ports(self.sysfs_root))
        self._read_host = read_host or hostinfo.read_host
        self._clock = clock
        self._said = None  # the last GPU source logged, to log a change once

    def _say(self, message: str) -> None:
        if message != self._said:
            log.warning("%s", message)
            self._said = message

    def _raw_gpus(self) -> list[dict]:
        if self._read_gpus is not None:
            return self._read_gpus()
        if self.gpu_source == "none":
            return []
        if self.gpu_source in ("auto", "nvml"):
            try:
                return nvml.read_gpus()
            except nvml.NvmlUnavailable as exc:
                if self.gpu_source == "nvml":
                    raise GpuReadError(str(exc)) from None
                if not nvidia_smi.available():
                    self._say(f"{exc}; no nvidia-smi either: reporting no GPUs")
                    return []
                self._say(f"{exc}; reading GPUs with nvidia-smi")
        try:
            return nvidia_smi.read_gpus()
        except nvidia_smi.NvidiaSmiError as exc:
            raise GpuReadError(str(exc)) from None

    def gpus(self) -> list[dict]:
        """The GPUs with their NUMA node and closest HCA filled in from sysfs."""
        gpus = self._raw_gpus()
        if len(gpus) > MAX_GPUS:
            self._say(f"{len(gpus)} GPUs; reporting the first {MAX_GPUS}")
            gpus = gpus[:MAX_GPUS]
        bus_ids = [gpu["pci_bus_id"] for gpu in gpus if gpu.get("pci_bus_id") and not gpu.get("nearest_hca")]
        if bus_ids:
            locality = sysfs.nearest_hcas(bus_ids, self.sysfs_root)
            for gpu in gpus:
                found = locality.get(gpu.get("pci_bus_id"))
                if found:
                    gpu["nearest_hca"] = found["nearest_hca"]
                    if gpu.get("numa_node") is None:
                        gpu["numa_node"] = found["numa_node"]
        return gpus

    def ib_ports(self) -> list[dict]:
        ports = self._read_ib_ports()
        if len(ports) > MAX_IB_PORTS:
            self._say(f"{len(ports)} IB ports; reporting the first {MAX_IB_PORTS}")
            ports = ports[:MAX_IB_PORTS]
        return ports

    def build(self, allocations: list[dict] | None = None, *, gpus: list[dict] | None = None) -> dict:
        host = self._read_host()
        return {
            "schema": REPORT_SCHEMA,
            "host": self.host_name,
            "agent_version": __version__,
            "time": self._clock(),
            "cpu": host.get("cpu", {}),
            "memory": host.get("memory", {}),
            "gpus": self.gpus() if gpus is None else gpus,
            "ib_ports": self.ib_ports(),
            "allocations": list(allocations or []),
        }
