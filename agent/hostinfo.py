"""CPU and memory of the host (psutil)."""
from __future__ import annotations

import os

import psutil

MIB = 2**20


def prime() -> None:
    """psutil measures CPU percent between two calls: make the first report's figure real."""
    psutil.cpu_percent(interval=None)


def read_host() -> dict:
    memory = psutil.virtual_memory()
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return {
        "cpu": {
            "percent": min(100.0, max(0.0, psutil.cpu_percent(interval=None))),
            "count": psutil.cpu_count(logical=True),
            "load1": load1,
        },
        # used = what programs hold (total - available), not the kernel's "used" that
        # leaves out reclaimable caches inconsistently across versions
        "memory": {"total_mib": memory.total // MIB, "used_mib": (memory.total - memory.available) // MIB},
    }
