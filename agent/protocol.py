"""The agent protocol: what `GET /v1/report` returns and `POST /v1/allocations` takes.

Shared by the agent (which builds reports), the simulator (which fakes them) and the
poller (which validates them). Pure Python and fast: a poll round validates thousands of
reports a second. Every error names the path of the bad field (`gpus[3].memory_used_mib`).
The schema is versioned: a report says `"schema": "fabricpool.report/1"`; a new minor
field is optional, an incompatible change bumps the number.
"""
from __future__ import annotations

import json
import math
import re

REPORT_SCHEMA = "fabricpool.report/1"
ALLOCATION_SCHEMA = "fabricpool.allocation/1"
MAX_REPORT_BYTES = 4 * 1024 * 1024  # a 8-GPU host with MIG and 8 HCAs is ~20 KB
MAX_REQUEST_BYTES = 256 * 1024
MAX_GRACE_S = 3600  # a job's grace period on stop, at most
ALLOCATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")  # it names the agent's log file

ALLOCATION_STATES = ("starting", "running", "succeeded", "failed", "stopped", "lost")
FINISHED_STATES = ("succeeded", "failed", "stopped", "lost")


class ProtocolError(ValueError):
    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _number(data, key, path, *, required=False, minimum=None, maximum=None, integer=False):
    value = data.get(key)
    where = f"{path}.{key}" if path else key
    if value is None:
        if required:
            raise ProtocolError(where, "required")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ProtocolError(where, f"expected a number, got {_kind(value)}")
    if integer and not (isinstance(value, int) or float(value).is_integer()):
        raise ProtocolError(where, f"expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(where, f"must be ≥ {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ProtocolError(where, f"must be ≤ {maximum}, got {value!r}")
    return int(value) if integer else float(value)


def _string(data, key, path, *, required=False, max_length=200, choices=None):
    value = data.get(key)
    where = f"{path}.{key}" if path else key
    if value is None:
        if required:
            raise ProtocolError(where, "required")
        return None
    if not isinstance(value, str):
        raise ProtocolError(where, f"expected a string, got {_kind(value)}")
    if len(value) > max_length:
        raise ProtocolError(where, f"longer than {max_length} characters")
    if choices is not None and value not in choices:
        raise ProtocolError(where, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _list(data, key, path, *, max_items):
    value = data.get(key, [])
    where = f"{path}.{key}" if path else key
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(where, f"expected a list, got {_kind(value)}")
    if len(value) > max_items:
        raise ProtocolError(where, f"more than {max_items} items")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ProtocolError(f"{where}[{i}]", f"expected an object, got {_kind(item)}")
    return value


def _object(data, key, path):
    value = data.get(key)
    where = f"{path}.{key}" if path else key
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(where, f"expected an object, got {_kind(value)}")
    return value


def load_json(body: bytes, *, max_bytes: int) -> dict:
    if len(body) > max_bytes:
        raise ProtocolError("", f"body of {len(body)} bytes is over the {max_bytes}-byte limit")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("", f"expected a JSON object, got {_kind(data)}")
    return data


def parse_report(body: bytes | dict, *, max_bytes: int = MAX_REPORT_BYTES) -> dict:
    """Validate and normalise a report. Returns plain data with known fields only."""
    data = body if isinstance(body, dict) else load_json(body, max_bytes=max_bytes)
    schema = _string(data, "schema", "", required=True)
    if schema != REPORT_SCHEMA:
        raise ProtocolError("schema", f"unsupported schema {schema!r}; this server reads {REPORT_SCHEMA}")
    report = {
        "schema": schema,
        "host": _string(data, "host", "", required=True, max_length=200),
        "agent_version": _string(data, "agent_version", "", max_length=40) or "",
        "time": _number(data, "time", "", required=True, minimum=0),
    }
    cpu = _object(data, "cpu", "")
    memory = _object(data, "memory", "")
    report["cpu"] = {
        "percent": _number(cpu, "percent", "cpu", minimum=0, maximum=100),
        "count": _number(cpu, "count", "cpu", minimum=0, integer=True),
        "load1": _number(cpu, "load1", "cpu", minimum=0),
    }
    report["memory"] = {
        "total_mib": _number(memory, "total_mib", "memory", minimum=0),
        "used_mib": _number(memory, "used_mib", "memory", minimum=0),
    }
    report["gpus"] = [_gpu(item, f"gpus[{i}]") for i, item in enumerate(_list(data, "gpus", "", max_items=64))]
    seen = set()
    for i, gpu in enumerate(report["gpus"]):
        if gpu["uuid"] in seen:
            raise ProtocolError(f"gpus[{i}].uuid", f"duplicate GPU UUID {gpu['uuid']}")
        seen.add(gpu["uuid"])
    report["ib_ports"] = [_ib_port(item, f"ib_ports[{i}]") for i, item in enumerate(_list(data, "ib_ports", "", max_items=64))]
    report["allocations"] = [_allocation(item, f"allocations[{i}]") for i, item in enumerate(_list(data, "allocations", "", max_items=1024))]
    return report


def _gpu(data, path):
    gpu = {
        "index": _number(data, "index", path, required=True, minimum=0, maximum=1023, integer=True),
        "uuid": _string(data, "uuid", path, required=True, max_length=80),
        "model": _string(data, "model", path, max_length=80) or "",
        "memory_total_mib": _number(data, "memory_total_mib", path, minimum=0),
        "memory_used_mib": _number(data, "memory_used_mib", path, minimum=0),
        "utilization_pct": _number(data, "utilization_pct", path, minimum=0, maximum=100),
        "temperature_c": _number(data, "temperature_c", path, minimum=-50, maximum=200),
        "power_w": _number(data, "power_w", path, minimum=0, maximum=10000),
        "power_limit_w": _number(data, "power_limit_w", path, minimum=0, maximum=10000),
        "ecc_corrected": _number(data, "ecc_corrected", path, minimum=0, integer=True),
        "ecc_uncorrected": _number(data, "ecc_uncorrected", path, minimum=0, integer=True),
        "compute_capability": _string(data, "compute_capability", path, max_length=10) or "",
        "numa_node": _number(data, "numa_node", path, minimum=-1, maximum=1024, integer=True),
        "pci_bus_id": _string(data, "pci_bus_id", path, max_length=40) or "",
        "nearest_hca": _string(data, "nearest_hca", path, max_length=40) or "",
        "mig_mode": bool(data.get("mig_mode", False)),
        # optional (added compatibly): set when the agent could not read this GPU, e.g. fallen off the bus
        "error": _string(data, "error", path, max_length=500) or "",
    }
    gpu["mig_instances"] = [
        {
            "uuid": _string(item, "uuid", f"{path}.mig_instances[{i}]", required=True, max_length=80),
            "gpu_instance_id": _number(item, "gpu_instance_id", f"{path}.mig_instances[{i}]", minimum=0, integer=True),
            "profile": _string(item, "profile", f"{path}.mig_instances[{i}]", max_length=40) or "",
            "memory_total_mib": _number(item, "memory_total_mib", f"{path}.mig_instances[{i}]", minimum=0),
            "memory_used_mib": _number(item, "memory_used_mib", f"{path}.mig_instances[{i}]", minimum=0),
        }
        for i, item in enumerate(_list(data, "mig_instances", path, max_items=16))
    ]
    if gpu["memory_used_mib"] is not None and gpu["memory_total_mib"] is not None and gpu["memory_used_mib"] > gpu["memory_total_mib"] * 1.01:
        raise ProtocolError(f"{path}.memory_used_mib", "more memory used than the GPU has")
    return gpu


COUNTER_NAMES = (
    "port_xmit_data_bytes", "port_rcv_data_bytes", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
    "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped",
)


def _ib_port(data, path):
    counters = _object(data, "counters", path)
    return {
        "device": _string(data, "device", path, required=True, max_length=40),
        "port": _number(data, "port", path, required=True, minimum=1, maximum=255, integer=True),
        "node_guid": _string(data, "node_guid", path, max_length=24) or "",
        "state": _string(data, "state", path, max_length=20) or "",
        "phys_state": _string(data, "phys_state", path, max_length=20) or "",
        "rate_gbps": _number(data, "rate_gbps", path, minimum=0, maximum=100000),
        "link_layer": _string(data, "link_layer", path, max_length=20) or "",
        "lid": _number(data, "lid", path, minimum=0, maximum=65535, integer=True),
        "counters": {
            name: _number(counters, name, f"{path}.counters", minimum=0, integer=True)
            for name in COUNTER_NAMES
            if counters.get(name) is not None
        },
    }


def _allocation(data, path):
    return {
        "id": _string(data, "id", path, required=True, max_length=80),
        "state": _string(data, "state", path, required=True, choices=ALLOCATION_STATES),
        "exit_code": _number(data, "exit_code", path, minimum=-255, maximum=255, integer=True),
        "started_at": _number(data, "started_at", path, minimum=0),
        "finished_at": _number(data, "finished_at", path, minimum=0),
        "gpus": [_gpu_ref(v, f"{path}.gpus[{i}]") for i, v in enumerate(data.get("gpus") or [])][:64],
        "reason": _string(data, "reason", path, max_length=500) or "",
    }


def _allocation_id(data):
    value = _string(data, "id", "", required=True, max_length=80)
    if not ALLOCATION_ID.match(value):
        raise ProtocolError("id", "letters, digits, '.', '_' and '-' only, starting with a letter or digit (it names the log file)")
    return value


def _gpu_ref(value, path):
    if not isinstance(value, str) or len(value) > 80:
        raise ProtocolError(path, "expected a GPU UUID string")
    return value


def parse_allocation_request(body: bytes | dict, *, max_bytes: int = MAX_REQUEST_BYTES) -> dict:
    """What the server POSTs to /v1/allocations to start work on this host."""
    data = body if isinstance(body, dict) else load_json(body, max_bytes=max_bytes)
    schema = _string(data, "schema", "", required=True)
    if schema != ALLOCATION_SCHEMA:
        raise ProtocolError("schema", f"unsupported schema {schema!r}; this agent reads {ALLOCATION_SCHEMA}")
    command = data.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) and len(c) < 4096 for c in command) or len(command) > 256:
        raise ProtocolError("command", "expected a non-empty list of strings (argv)")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()) or len(env) > 256:
        raise ProtocolError("env", "expected an object of string values")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus or len(gpus) > 64:
        raise ProtocolError("gpus", "expected a non-empty list of GPU UUIDs")
    dist = _object(data, "distributed", "")
    parsed = {
        "schema": schema,
        "id": _allocation_id(data),
        "command": command,
        "env": env,
        "gpus": [_gpu_ref(v, f"gpus[{i}]") for i, v in enumerate(gpus)],
        "duration_s": _number(data, "duration_s", "", minimum=0),  # the simulator's workload length
        "workload": _string(data, "workload", "", max_length=40) or "training",
        "distributed": {
            "master_addr": _string(dist, "master_addr", "distributed", max_length=200),
            "master_port": _number(dist, "master_port", "distributed", minimum=1, maximum=65535, integer=True),
            "world_size": _number(dist, "world_size", "distributed", minimum=1, integer=True),
            "node_rank": _number(dist, "node_rank", "distributed", minimum=0, integer=True),
            "nproc_per_node": _number(dist, "nproc_per_node", "distributed", minimum=1, integer=True),
        },
    }
    # sharing: optional "share" for a fraction of one GPU: {"milli": 1-999, "memory_mib": N,
    # "mig_profile": "3g.40gb"}; absent for whole GPUs (so older requests parse as before).
    if data.get("share") is not None:
        share = _object(data, "share", "")
        parsed["share"] = {
            "milli": _number(share, "milli", "share", required=True, minimum=1, maximum=999, integer=True),
            "memory_mib": _number(share, "memory_mib", "share", minimum=0, integer=True) or 0,
            "mig_profile": _string(share, "mig_profile", "share", max_length=20) or "",
        }
        if len(gpus) != 1:
            raise ProtocolError("share", "a shared allocation uses exactly one GPU")
    # sharing: end
    # Optional (added compatibly): the job's own SIGTERM -> SIGKILL grace period on stop, which
    # replaces the agent's --grace-seconds for this allocation. Absent: the agent's.
    if data.get("grace_period_s") is not None:
        parsed["grace_period_s"] = _number(data, "grace_period_s", "", minimum=0, maximum=MAX_GRACE_S)
    return parsed


def derive_token(secret: str | bytes, host: str) -> str:
    """A host's bearer token: HMAC-SHA256 of its name under the cluster's agent secret.
    The server derives tokens instead of storing them; each agent keeps only its own."""
    import hashlib
    import hmac

    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"fabricpool-agent:{host}".encode(), hashlib.sha256).hexdigest()


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison of a bearer token (hashed first so lengths leak nothing)."""
    import hashlib
    import hmac

    if not presented:
        return False
    return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), hashlib.sha256(expected.encode()).digest())
