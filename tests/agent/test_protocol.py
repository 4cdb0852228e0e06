"""The protocol as docs/agent-protocol.md states it, and the agent's reports within it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.protocol import COUNTER_NAMES, ProtocolError, parse_allocation_request, parse_report
from agent.report import MAX_GPUS, Collector

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-protocol.md"


def _doc_examples() -> list[dict]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)]


def test_the_documented_examples_validate():
    report, request = _doc_examples()
    parsed = parse_report(json.dumps(report).encode())
    assert parsed["gpus"][1]["mig_instances"][0]["profile"] == "3g.40gb"
    assert parsed["ib_ports"][0]["counters"]["port_xmit_data_bytes"] == 938475628124
    assert parse_allocation_request(json.dumps(request).encode())["distributed"]["node_rank"] == 1


def test_every_field_the_parser_knows_is_documented():
    report, _ = _doc_examples()
    parsed = parse_report(report)
    text = DOC.read_text()
    names = set(parsed) | set(parsed["cpu"]) | set(parsed["memory"]) | set(parsed["gpus"][0]) \
        | set(parsed["gpus"][1]["mig_instances"][0]) | set(parsed["ib_ports"][0]) | set(parsed["allocations"][0]) \
        | set(COUNTER_NAMES)
    # as `name`, `name, ...`, `parent.name` or `name.child`
    missing = sorted(name for name in names if not any(form in text for form in (f"`{name}`", f"`{name},", f".{name}`", f"`{name}.")))
    assert missing == []


def test_gpu_error_is_optional_and_bounded():
    report, _ = _doc_examples()
    assert parse_report(report)["gpus"][0]["error"] == ""
    report["gpus"][0]["error"] = "GPU 0 is lost: GPU is lost"
    assert parse_report(report)["gpus"][0]["error"] == "GPU 0 is lost: GPU is lost"
    report["gpus"][0]["error"] = "x" * 501
    with pytest.raises(ProtocolError) as refused:
        parse_report(report)
    assert refused.value.path == "gpus[0].error"


def test_reports_stay_within_the_list_limits(tmp_path, caplog):
    many = [{"index": i, "uuid": f"GPU-{i}", "mig_mode": False} for i in range(MAX_GPUS + 8)]
    ports = [{"device": f"mlx5_{i}", "port": 1, "counters": {}} for i in range(70)]
    collector = Collector("big", sysfs_root=tmp_path, read_gpus=lambda: many, read_ib_ports=lambda: ports,
                          read_host=lambda: {"cpu": {}, "memory": {}})
    report = parse_report(collector.build([]))
    assert len(report["gpus"]) == MAX_GPUS and len(report["ib_ports"]) == 64
    assert f"{MAX_GPUS + 8} GPUs; reporting the first {MAX_GPUS}" in caplog.text


def test_report_with_every_allocation_state_validates(tmp_path):
    allocations = [
        {"id": "a", "state": "starting", "exit_code": None, "started_at": None, "finished_at": None, "gpus": ["GPU-0"], "reason": ""},
        {"id": "b", "state": "stopped", "exit_code": -9, "started_at": 1.0, "finished_at": 2.0, "gpus": ["MIG-1"],
         "reason": "stopped on request (SIGKILL after 10 s grace)"},
        {"id": "c", "state": "lost", "exit_code": None, "started_at": 1.0, "finished_at": 3.0, "gpus": ["GPU-1"],
         "reason": "exit code unknown: it ended while the agent was down"},
    ]
    collector = Collector("gpu001", sysfs_root=tmp_path, read_gpus=list)
    assert [a["state"] for a in parse_report(collector.build(allocations))["allocations"]] == ["starting", "stopped", "lost"]


def test_allocation_id_must_be_safe_as_a_file_name():
    from agent.protocol import ALLOCATION_SCHEMA, ProtocolError, parse_allocation_request

    body = {"schema": ALLOCATION_SCHEMA, "id": "../../etc/passwd", "command": ["true"], "gpus": ["GPU-a"]}
    with pytest.raises(ProtocolError) as info:
        parse_allocation_request(body)
    assert info.value.path == "id"
