"""InfiniBand ports and PCI locality from sysfs.

`read_ib_ports(root)` reads `{root}/class/infiniband/<dev>/ports/<n>/` the way
node_exporter's infiniband collector does; `nearest_hcas(bus_ids, root)` finds, for
each GPU, the HCA behind the same PCIe switch (else on the same NUMA node), which the
launcher puts into `NCCL_IB_HCA`. Both take the sysfs root as a path so that tests run
them on fixture trees.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

SATURATED_32 = 2**32 - 1  # a 32-bit PMA counter pinned at its ceiling: the real value is unknown

# sysfs counter file -> report counter name. The data counters count 4-byte words.
_COUNTER_FILES = {
    "port_xmit_data": "port_xmit_data_bytes",
    "port_rcv_data": "port_rcv_data_bytes",
    "port_xmit_packets": "port_xmit_packets",
    "port_rcv_packets": "port_rcv_packets",
    "port_xmit_wait": "port_xmit_wait",
    "symbol_error": "symbol_error",
    "link_downed": "link_downed",
    "link_error_recovery": "link_error_recovery",
    "port_rcv_errors": "port_rcv_errors",
    "port_xmit_discards": "port_xmit_discards",
    "port_rcv_remote_physical_errors": "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors": "port_rcv_switch_relay_errors",
    "local_link_integrity_errors": "local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "VL15_dropped": "VL15_dropped",
}
_WORD_COUNTERS = {"port_xmit_data", "port_rcv_data"}
# mlx4's 64-bit legacy counters, used only when the 32-bit one is saturated.
_EXTENDED = {
    "port_xmit_data": "port_xmit_data_64",
    "port_rcv_data": "port_rcv_data_64",
    "port_xmit_packets": "port_xmit_packets_64",
    "port_rcv_packets": "port_rcv_packets_64",
}
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _after_colon(text: str | None) -> str:
    """`"4: ACTIVE"` -> `"ACTIVE"`, `"5: LinkUp"` -> `"LinkUp"`."""
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_rate(text: str | None) -> float | None:
    """`"400 Gb/sec (4X NDR)"` -> 400.0; `"2.5 Gb/sec (1X SDR)"` -> 2.5."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


def parse_guid(text: str | None) -> str:
    """`"0a7f:bc12:45ef:d23b"` -> `"0x0a7fbc1245efd23b"`; anything else -> ""."""
    digits = (text or "").replace(":", "").lower()
    if len(digits) != 16 or not all(c in "0123456789abcdef" for c in digits):
        return ""
    return "0x" + digits


def parse_counter(text: str | None) -> int | None:
    """A counter file's value; None for "N/A (no PMA)", garbage and saturated 32-bit counters."""
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return None if value == SATURATED_32 else value


def _lid(text: str | None) -> int | None:
    try:
        return int(text, 0) if text else None  # sysfs prints "0x1a"
    except ValueError:
        return None


def read_ib_ports(root: str | os.PathLike = "/sys") -> list[dict]:
    """Every port of every IB device under {root}/class/infiniband, sorted by device and port."""
    base = Path(root) / "class" / "infiniband"
    if not base.is_dir():
        return []
    ports = []
    for device in sorted(base.iterdir()):
        node_guid = parse_guid(_read(device / "node_guid"))
        ports_dir = device / "ports"
        if not ports_dir.is_dir():
            continue
        for port_dir in sorted((p for p in ports_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            ports.append({
                "device": device.name,
                "port": int(port_dir.name),
                "node_guid": node_guid,
                "state": _after_colon(_read(port_dir / "state")),
                "phys_state": _after_colon(_read(port_dir / "phys_state")),
                "rate_gbps": parse_rate(_read(port_dir / "rate")),
                "link_layer": _read(port_dir / "link_layer") or "",
                "lid": _lid(_read(port_dir / "lid")),
                "counters": _counters(port_dir),
            })
    return ports


def _counters(port_dir: Path) -> dict:
    counters = {}
    for filename, name in _COUNTER_FILES.items():
        raw = _read(port_dir / "counters" / filename)
        value = parse_counter(raw)
        if value is None and raw is not None and raw.isdigit() and filename in _EXTENDED:
            # saturated 32-bit counter: the 64-bit legacy copy (mlx4) still counts
            value = parse_counter(_read(port_dir / "counters_ext" / _EXTENDED[filename]))
        if value is None:
            continue
        counters[name] = value * 4 if filename in _WORD_COUNTERS else value
    return counters


# ---------------------------------------------------------------- PCI locality


def sysfs_bdf(bus_id: str) -> str:
    """NVML/nvidia-smi bus id `"00000000:1B:00.0"` -> sysfs name `"0000:1b:00.0"`."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def _numa(path: Path) -> int | None:
    text = _read(path / "numa_node")
    try:
        node = int(text) if text is not None else None
    except ValueError:
        return None
    return node if node is not None and node >= 0 else None  # -1: the kernel does not know


def _pci_chain(path: Path) -> list[str]:
    """The PCI functions from the root port down to the device itself."""
    return [part for part in path.parts if _BDF.match(part)]


def pick_nearest(gpu_path: Path | None, gpu_numa: int | None, hcas: dict[str, tuple[Path | None, int | None]]) -> str:
    """The HCA closest to a GPU: the one sharing the deepest PCI bridge with it (same PCIe
    switch or root port), else one on the same NUMA node, else "". Ties go to the first name.
    `hcas` maps device name -> (resolved PCI path, NUMA node)."""
    best, best_depth = "", 0
    if gpu_path is not None:
        gpu_chain = _pci_chain(gpu_path)[:-1]  # the bridges above the GPU
        for name in sorted(hcas):
            path, _ = hcas[name]
            if path is None:
                continue
            depth = 0
            for a, b in zip(gpu_chain, _pci_chain(path)[:-1], strict=False):
                if a != b:
                    break
                depth += 1
            if depth > best_depth:
                best, best_depth = name, depth
    if best:
        return best
    if gpu_numa is not None:
        for name in sorted(hcas):
            if hcas[name][1] == gpu_numa:
                return name
    return ""


def _resolve(path: Path) -> Path | None:
    try:
        return path.resolve(strict=True)
    except OSError:
        return None


def ib_devices(root: str | os.PathLike = "/sys") -> dict[str, tuple[Path | None, int | None]]:
    base = Path(root) / "class" / "infiniband"
    if not base.is_dir():
        return {}
    devices = {}
    for device in sorted(base.iterdir()):
        pci = _resolve(device / "device")
        devices[device.name] = (pci, _numa(pci) if pci else None)
    return devices


def gpu_locality(bus_id: str, root: str | os.PathLike = "/sys") -> tuple[Path | None, int | None]:
    path = _resolve(Path(root) / "bus" / "pci" / "devices" / sysfs_bdf(bus_id)) if bus_id else None
    return path, (_numa(path) if path else None)


def nearest_hcas(bus_ids: list[str], root: str | os.PathLike = "/sys") -> dict[str, dict]:
    """For each GPU bus id: {"nearest_hca": name or "", "numa_node": int or None}."""
    hcas = ib_devices(root)
    result = {}
    for bus_id in bus_ids:
        path, numa = gpu_locality(bus_id, root)
        result[bus_id] = {"nearest_hca": pick_nearest(path, numa, hcas), "numa_node": numa}
    return result
