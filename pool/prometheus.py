"""Telemetry from exporters a cluster may already run, mapped onto the agent's report shape
(agent/protocol.py) so that one ingest path serves every host.

* dcgm-exporter (`DCGM_FI_*`): one series per GPU, or one per GPU instance under MIG
  (extra labels GPU_I_ID, GPU_I_PROFILE). The GPU is identified by its UUID label
  (`UUID`, or `uuid` with --use-old-namespace), never by the `gpu` index alone.
* node_exporter's infiniband collector (`node_infiniband_*`, labels device and port) and its
  memory gauges.

Parsed with prometheus_client's parser. It renames counter samples (`X` -> `X_total`), so
everything here keys on the family name. Pure: no Django, no I/O.
"""
from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from agent.protocol import REPORT_SCHEMA

# DCGM writes "no value" as huge sentinels (DCGM_INT64_BLANK = 0x7ffffffffffffff0 and the
# FP64 blank 2**47, each + 1..3 for not found / not supported / no permission).
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0
SATURATED_32 = 2**32 - 1

# node_exporter's state_id / physical_state_id gauges -> the sysfs words the agent reports.
PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "PhyTest"}

# node_exporter family (without _total) -> protocol counter name (agent/protocol.COUNTER_NAMES)
IB_COUNTERS = {
    "node_infiniband_port_data_transmitted_bytes": "port_xmit_data_bytes",
    "node_infiniband_port_data_received_bytes": "port_rcv_data_bytes",
    "node_infiniband_port_packets_transmitted": "port_xmit_packets",
    "node_infiniband_port_packets_received": "port_rcv_packets",
    "node_infiniband_port_transmit_wait": "port_xmit_wait",
    "node_infiniband_symbol_error": "symbol_error",
    "node_infiniband_link_downed": "link_downed",
    "node_infiniband_link_error_recovery": "link_error_recovery",
    "node_infiniband_port_errors_received": "port_rcv_errors",
    "node_infiniband_port_discards_transmitted": "port_xmit_discards",
    "node_infiniband_port_receive_remote_physical_errors": "port_rcv_remote_physical_errors",
    "node_infiniband_port_receive_switch_relay_errors": "port_rcv_switch_relay_errors",
    "node_infiniband_local_link_integrity_errors": "local_link_integrity_errors",
    "node_infiniband_excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "node_infiniband_vl15_dropped": "VL15_dropped",
}
# mlx4's 64-bit copies (counters_ext), used where the 32-bit counter is missing or zero.
IB_LEGACY = {
    "node_infiniband_legacy_data_transmitted_bytes": "port_xmit_data_bytes",
    "node_infiniband_legacy_data_received_bytes": "port_rcv_data_bytes",
    "node_infiniband_legacy_packets_transmitted": "port_xmit_packets",
    "node_infiniband_legacy_packets_received": "port_rcv_packets",
}


class ExporterError(ValueError):
    """The text is not Prometheus exposition, or has none of the expected metrics."""


def _value(raw) -> float | None:
    if raw is None:
        return None
    value = float(raw)
    if math.isnan(value) or math.isinf(value):
        return None
    if value >= FP64_BLANK:  # covers the int64 sentinels too
        return None
    return value


def _families(text: str):
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ExporterError(f"not Prometheus text: {exc}") from None


def parse_dcgm(text: str) -> dict:
    """dcgm-exporter text -> {"gpus": [...], "hostname": label value or "", "driver": ...}.
    GPUs are in the report's shape (agent.protocol._gpu), ordered by index."""
    gpus: dict[str, dict] = {}  # uuid -> values
    instances: dict[str, dict[str, dict]] = {}  # uuid -> GPU_I_ID -> values
    hostname = driver = ""
    for family in _families(text):
        name = family.name
        if not name.startswith("DCGM_"):
            continue
        for sample in family.samples:
            labels = sample.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            if not uuid:
                continue  # NVLink/NVSwitch entity series carry gpu_uuid and are not per GPU
            hostname = hostname or labels.get("Hostname") or labels.get("hostname") or ""
            driver = driver or labels.get("DCGM_FI_DRIVER_VERSION", "")
            gpu = gpus.setdefault(uuid, {"_labels": labels})
            value = _value(sample.value)
            instance_id = labels.get("GPU_I_ID")
            if instance_id not in (None, ""):
                instance = instances.setdefault(uuid, {}).setdefault(
                    instance_id, {"profile": labels.get("GPU_I_PROFILE", "")})
                instance[name] = value
                # Device-level fields repeat on every instance series: keep one copy.
                if name not in _INSTANCE_FIELDS:
                    gpu.setdefault(name, value)
            else:
                gpu[name] = value
    if not gpus:
        raise ExporterError("no DCGM_FI_* series with a GPU UUID label: is this a dcgm-exporter /metrics page?")
    result = [_dcgm_gpu(uuid, values, instances.get(uuid, {})) for uuid, values in gpus.items()]
    result.sort(key=lambda g: (g["index"], g["uuid"]))
    return {"gpus": result, "hostname": hostname, "driver": driver}


# Fields measured per GPU instance under MIG (the others are device-wide).
_INSTANCE_FIELDS = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED",
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"}


def _memory(values) -> tuple[float | None, float | None]:
    used, free, reserved = (values.get(f"DCGM_FI_DEV_FB_{k}") for k in ("USED", "FREE", "RESERVED"))
    total = values.get("DCGM_FI_DEV_FB_TOTAL")
    if total is None and used is not None and free is not None:
        total = used + free + (reserved or 0)
    return used, total


def _int(value):
    return None if value is None else int(value)


def _dcgm_gpu(uuid: str, values: dict, instances: dict) -> dict:
    labels = values["_labels"]
    try:
        index = int(labels.get("gpu", ""))
    except ValueError:
        index = None
    used, total = _memory(values)
    utilization = values.get("DCGM_FI_DEV_GPU_UTIL")
    mig_instances = []
    for instance_id, inst in sorted(instances.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0):
        i_used, i_total = _memory(inst)
        mig_instances.append({
            "uuid": f"{uuid}/gi{instance_id}",  # MIG device UUIDs are not among the labels
            "gpu_instance_id": int(instance_id) if instance_id.isdigit() else None,
            "profile": inst.get("profile", ""),
            "memory_total_mib": i_total,
            "memory_used_mib": i_used,
        })
    if instances:
        # GPU_UTIL is not reported under MIG; the engine-active ratio is, per instance.
        actives = [inst["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] for inst in instances.values()
                   if inst.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE") is not None]
        if utilization is None and actives:
            utilization = 100.0 * sum(actives) / len(actives)
        used_parts = [m["memory_used_mib"] for m in mig_instances if m["memory_used_mib"] is not None]
        used = sum(used_parts) if used_parts else None
        total = None  # instances do not cover the whole memory; keep the known total
    elif utilization is None and values.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE") is not None:
        utilization = 100.0 * values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    power_limit = values.get("DCGM_FI_DEV_ENFORCED_POWER_LIMIT") or values.get("DCGM_FI_DEV_POWER_MGMT_LIMIT")
    return {
        "index": index if index is not None else 0,
        "uuid": uuid,
        "model": labels.get("modelName") or labels.get("model_name") or "",
        "memory_total_mib": total,
        "memory_used_mib": used,
        "utilization_pct": None if utilization is None else min(100.0, max(0.0, utilization)),
        "temperature_c": values.get("DCGM_FI_DEV_GPU_TEMP"),
        "power_w": values.get("DCGM_FI_DEV_POWER_USAGE"),
        "power_limit_w": power_limit,
        "ecc_corrected": _int(values.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
        "ecc_uncorrected": _int(values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
        "pci_bus_id": labels.get("pci_bus_id", ""),
        "mig_mode": bool(instances),
        "mig_instances": mig_instances,
    }


def parse_node_exporter(text: str) -> dict:
    """node_exporter text -> {"ib_ports": [...], "memory": {total_mib, used_mib}} in the
    report's shape. node_exporter exposes no node GUID, so ports carry none."""
    ports: dict[tuple[str, int], dict] = {}
    legacy: dict[tuple[str, int], dict] = {}
    memory = {}
    for family in _families(text):
        name = family.name
        if name in ("node_memory_MemTotal_bytes", "node_memory_MemAvailable_bytes"):
            for sample in family.samples:
                value = _value(sample.value)
                if value is not None:
                    memory[name] = value / 2**20
            continue
        if not name.startswith("node_infiniband_") or name == "node_infiniband_info":
            continue
        for sample in family.samples:
            device, port = sample.labels.get("device"), sample.labels.get("port", "")
            if not device or not port.isdigit():
                continue
            key = (device, int(port))
            value = _value(sample.value)
            entry = ports.setdefault(key, {"device": device, "port": int(port), "counters": {}})
            if value is None:
                continue
            if name in IB_COUNTERS:
                if value != SATURATED_32:  # a pinned 32-bit counter says nothing (as the agent does)
                    entry["counters"][IB_COUNTERS[name]] = int(value)
            elif name in IB_LEGACY:
                legacy.setdefault(key, {})[IB_LEGACY[name]] = int(value)
            elif name == "node_infiniband_state_id":
                entry["state"] = PORT_STATES.get(int(value), str(int(value)))
            elif name == "node_infiniband_physical_state_id":
                entry["phys_state"] = PHYS_STATES.get(int(value), str(int(value)))
            elif name == "node_infiniband_rate_bytes_per_second":
                entry["rate_gbps"] = value * 8 / 1e9
    for key, counters in legacy.items():
        current = ports[key]["counters"]
        for counter, value in counters.items():
            if not current.get(counter):
                current[counter] = value
    result = {"ib_ports": [ports[key] for key in sorted(ports)]}
    total = memory.get("node_memory_MemTotal_bytes")
    available = memory.get("node_memory_MemAvailable_bytes")
    result["memory"] = {"total_mib": total, "used_mib": total - available if total is not None and available is not None else None}
    return result


def report_from_exporters(host: str, *, dcgm_text: str | None, node_text: str | None, now: float) -> dict:
    """A report dict (to validate with agent.protocol.parse_report) from scraped texts."""
    report = {"schema": REPORT_SCHEMA, "host": host, "time": now, "gpus": [], "ib_ports": [], "allocations": []}
    if dcgm_text is not None:
        dcgm = parse_dcgm(dcgm_text)
        report["gpus"] = dcgm["gpus"]
        report["agent_version"] = f"dcgm-exporter, driver {dcgm['driver']}"[:40] if dcgm["driver"] else "dcgm-exporter"
    if node_text is not None:
        node = parse_node_exporter(node_text)
        report["ib_ports"] = node["ib_ports"]
        report["memory"] = node["memory"]
        report.setdefault("agent_version", "node_exporter")
    return report
