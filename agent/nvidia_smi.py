"""GPUs through `nvidia-smi` when NVML cannot be loaded from Python.

`--query-gpu` gives one row per physical GPU; MIG instances never appear there, so their
UUIDs and profiles come from `nvidia-smi -L`. Unsupported values read `[N/A]` (or another
bracketed note such as `[Requested functionality has been deprecated]`) and become None.
Every field asked for exists in both the old (≤ 515) and the 590 drivers' `--help-query-gpu`:
asking for an unknown field makes nvidia-smi fail outright.
"""
from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess

QUERY_FIELDS = (
    "index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu", "temperature.gpu",
    "power.draw", "enforced.power.limit", "pci.bus_id", "compute_cap", "mig.mode.current",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
)
TIMEOUT_S = 10


class NvidiaSmiError(RuntimeError):
    pass


def _value(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    if not text or text.upper() in ("N/A", "[N/A]") or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def _number(text: str | None) -> float | None:
    """`"19818 MiB"` / `"19818"` -> 19818.0; units after the number are dropped."""
    text = _value(text)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


def _integer(text: str | None) -> int | None:
    number = _number(text)
    return int(number) if number is not None else None


def parse_query_gpu(text: str, fields: tuple[str, ...] | None = QUERY_FIELDS) -> list[dict]:
    """Rows of `--query-gpu` CSV as GPU dicts of the report.

    With `fields`, the text is `--format=csv,noheader,nounits` output for those fields;
    with `fields=None` the first line is the header (units in brackets are ignored)."""
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row]
    if fields is None:
        if not rows:
            return []
        fields = tuple(re.sub(r"\s*\[.*\]$", "", name.strip()) for name in rows[0])
        rows = rows[1:]
    gpus = []
    for line, row in enumerate(rows, start=1):
        if len(row) != len(fields):
            raise NvidiaSmiError(f"nvidia-smi row {line}: {len(row)} values for {len(fields)} fields")
        data = dict(zip(fields, row, strict=True))
        mig = _value(data.get("mig.mode.current"))
        if _integer(data.get("index")) is None or not _value(data.get("uuid")):
            raise NvidiaSmiError(f"nvidia-smi row {line}: no GPU index or UUID")
        gpus.append({
            "index": _integer(data.get("index")),
            "uuid": _value(data.get("uuid")) or "",
            "model": _value(data.get("name")) or "",
            "memory_total_mib": _number(data.get("memory.total")),
            "memory_used_mib": _number(data.get("memory.used")),
            "utilization_pct": _number(data.get("utilization.gpu")),
            "temperature_c": _number(data.get("temperature.gpu")),
            "power_w": _number(data.get("power.draw")),
            "power_limit_w": _number(data.get("enforced.power.limit", data.get("power.limit"))),
            "ecc_corrected": _integer(data.get("ecc.errors.corrected.volatile.total")),
            "ecc_uncorrected": _integer(data.get("ecc.errors.uncorrected.volatile.total")),
            "compute_capability": _value(data.get("compute_cap")) or "",
            "numa_node": None,
            "pci_bus_id": _value(data.get("pci.bus_id")) or "",
            "nearest_hca": "",
            "mig_mode": (mig or "").lower() == "enabled",
            "mig_instances": [],
        })
    return gpus


_LIST_GPU = re.compile(r"^GPU\s+\d+:.*\(UUID:\s*(\S+)\)")
_LIST_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+\d+:\s*\(UUID:\s*(\S+)\)")


def parse_list(text: str) -> dict[str, list[dict]]:
    """`nvidia-smi -L` -> {GPU UUID: [{"uuid": MIG UUID, "profile": "1g.10gb"}, ...]}."""
    result: dict[str, list[dict]] = {}
    current = None
    for line in text.splitlines():
        if match := _LIST_GPU.match(line):
            current = match.group(1)
            result[current] = []
        elif (match := _LIST_MIG.match(line)) and current is not None:
            result[current].append({
                "uuid": match.group(2), "gpu_instance_id": None, "profile": match.group(1),
                "memory_total_mib": None, "memory_used_mib": None,
            })
    return result


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvidiaSmiError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise NvidiaSmiError(f"{' '.join(argv[:2])} exited with {done.returncode}: {detail[0] if detail else ''}")
    return done.stdout


def available(binary: str = "nvidia-smi") -> bool:
    return shutil.which(binary) is not None


def read_gpus(binary: str = "nvidia-smi") -> list[dict]:
    text = _run([binary, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"])
    gpus = parse_query_gpu(text)
    if any(gpu["mig_mode"] for gpu in gpus):
        instances = parse_list(_run([binary, "-L"]))
        for gpu in gpus:
            if gpu["mig_mode"]:
                gpu["mig_instances"] = instances.get(gpu["uuid"], [])
    return gpus
