"""The Prometheus parsers on their own (pool/prometheus.py): any text is parsed or refused
with ExporterError, never another exception; what parses keeps its promises (numbers are
finite or missing, GPU indexes are integers). The poller path around them is fuzzed in
test_agent_report_fuzz.py."""
import math

from hypothesis import given
from hypothesis import strategies as st

from pool.prometheus import ExporterError, parse_dcgm, parse_node_exporter
from tests.conftest import read_sample

from .strategies import FUZZ, mutated

DCGM = [read_sample(name) for name in ("dcgm-exporter_metrics-T4-rafay.prom", "dcgm-exporter_metrics-A100-40C-vgpu-vks.prom",
                                       "dcgm-exporter_metrics-MIG-A30-excerpt-dcgm-exporter-issue317.prom")]
NODE = read_sample("node-exporter_e2e-output_infiniband.prom")
LINE = st.builds(lambda name, labels, value: f"{name}{{{labels}}} {value}\n",
                 st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "node_infiniband_port_data_received_bytes_total",
                                  "x", ""]),
                 st.text(max_size=40), st.one_of(st.sampled_from(["1", "NaN", "+Inf", "-1", "1e400", "x", ""]),
                                                 st.floats().map(repr)))


def text_of(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def finite_or_none(value):
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value))


@FUZZ
@given(st.one_of(st.sampled_from(DCGM).flatmap(mutated).map(text_of), st.lists(LINE, max_size=8).map("".join),
                 st.text(max_size=300)))
def test_dcgm_text_is_parsed_or_refused_with_an_exporter_error(text):
    try:
        parsed = parse_dcgm(text)
    except ExporterError as exc:
        assert str(exc)
        return
    for gpu in parsed["gpus"]:
        assert isinstance(gpu["index"], int)
        assert all(finite_or_none(v) for k, v in gpu.items() if isinstance(v, float))


@FUZZ
@given(st.one_of(mutated(NODE).map(text_of), st.lists(LINE, max_size=8).map("".join), st.text(max_size=300)))
def test_node_exporter_text_is_parsed_or_refused_with_an_exporter_error(text):
    try:
        parsed = parse_node_exporter(text)
    except ExporterError as exc:
        assert str(exc)
        return
    assert isinstance(parsed["ib_ports"], list)
