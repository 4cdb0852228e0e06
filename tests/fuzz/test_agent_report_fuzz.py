"""What agents and exporters answer, broken every way hypothesis can think of, through the
poller's own parsing (pool.poller._report, the HTTP fetch replaced by the fuzzed body):
each body becomes a report or a FetchError with a clear message, nothing else; every
report it accepts is stored by the ingest without error. The agent's allocation request
parser is held to the same rule (a dict or a ProtocolError)."""
import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent.protocol import ProtocolError, parse_allocation_request
from pool import ingest, poller
from pool.models import Host
from tests.conftest import read_sample

from .strategies import FUZZ, FUZZ_DB, JSON_ANY, mutated, mutated_json

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-protocol.md"
REPORT, REQUEST = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)][:2]
REPORT["host"] = "gpu001"
REPORT_BYTES = json.dumps(REPORT, indent=1).encode()
DCGM = read_sample("dcgm-exporter_metrics-L40S-upcloud.prom")
MIG = read_sample("dcgm-exporter_metrics-MIG-H100-excerpt-dcgm-exporter-issue512.prom")
NODE = read_sample("node-exporter_e2e-output_infiniband.prom")

AGENT_BODIES = st.one_of(
    st.binary(max_size=500),
    JSON_ANY.map(lambda v: json.dumps(v).encode()),
    mutated_json(REPORT).map(lambda v: json.dumps(v).encode()),
    mutated_json(REPORT).map(lambda v: json.dumps(v).encode()),
    mutated(REPORT_BYTES, max_ops=2),
)
EXPORTER_BODIES = st.tuples(st.one_of(mutated(DCGM), mutated(MIG), st.binary(max_size=300)),
                            st.one_of(mutated(NODE), st.text(max_size=300).map(str.encode)))


def fetch(kind: str, bodies: dict[str, bytes]):
    """poller._report for a host gpu001 whose URLs answer `bodies`; (report, error)."""
    target = poller.Target(1, "gpu001", "http://agent/metrics", token="t", kind=kind, ib_url="http://ib/metrics")

    async def fake_get(session, url, limits, *, token=""):
        return bodies["ib" if url.startswith("http://ib/") else "main"]

    async def run():
        original, poller._get = poller._get, fake_get
        try:
            return await poller._report(None, target, poller.Limits()), None
        except poller.FetchError as exc:
            return None, exc
        finally:
            poller._get = original

    report, error = asyncio.run(run())
    if error is not None:
        assert error.kind in {poller.INVALID, poller.WRONG_HOST} and error.message, error
    return report


@FUZZ
@given(AGENT_BODIES)
def test_an_agent_body_is_a_report_or_a_clear_refusal(body):
    report = fetch(poller.KIND_AGENT, {"main": body})
    if report is not None:
        assert report["host"] == "gpu001"


@FUZZ
@given(EXPORTER_BODIES)
def test_exporter_pages_are_a_report_or_a_clear_refusal(bodies):
    fetch(poller.KIND_DCGM, {"main": bodies[0], "ib": bodies[1]})
    fetch(poller.KIND_NODE_EXPORTER, {"main": bodies[1]})


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated_json(REQUEST).map(lambda v: json.dumps(v).encode())))
def test_an_allocation_request_is_parsed_or_refused_with_a_protocol_error(body):
    try:
        request = parse_allocation_request(body)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert request["id"] and request["command"]


@pytest.mark.django_db
@FUZZ_DB
@given(st.one_of(AGENT_BODIES, EXPORTER_BODIES))
def test_every_report_the_poller_accepts_is_stored(body):
    host, _ = Host.objects.get_or_create(name="gpu001")
    if isinstance(body, tuple):
        report = fetch(poller.KIND_DCGM, {"main": body[0], "ib": body[1]})
    else:
        report = fetch(poller.KIND_AGENT, {"main": body})
    event("refused" if report is None else "accepted")  # shown by --hypothesis-show-statistics
    if report is None:
        return
    ingest.apply_results([poller.Result(host.pk, "gpu001", report=report, received_at=time.time())])
    stored = set(Host.objects.get(pk=host.pk).gpus.values_list("uuid", flat=True))
    assert {g["uuid"] for g in report["gpus"]} <= stored
