"""perfquery and iblinkinfo parsers on real output (treydock/infiniband_exporter fixtures,
and output captured from the real tools against ibsim) and on broken input."""
import pytest

from fabric import linkinfo, perfquery
from tests.conftest import read_sample


# --- perfquery --------------------------------------------------------------------------


def test_extended_counters_of_two_switch_ports():
    records = perfquery.parse(read_sample("perfquery-x_treydock_switch_lid1719_ports1-2.txt"))
    assert [(r.lid, r.port, r.kind) for r in records] == [(1719, 1, "extended"), (1719, 2, "extended")]
    first, second = records
    assert first.cap_mask == 0x5300
    assert first.counters["PortXmitData"] == 36298026860928
    assert first.counters["PortRcvData"] == 12279028775751
    assert first.counters["PortMulticastRcvPkts"] == 5584846741
    assert first.counters["PortXmitWait"] == 22730501
    assert first.counters["SymbolErrorCounter"] == 0
    assert second.counters["PortXmitData"] == 26006570014026
    assert second.counters["PortXmitWait"] == 36510964
    # selectors are not counters
    assert "PortSelect" not in first.counters and "CounterSelect2" not in first.counters
    assert len(first.counters) == 22


def test_extended_counters_with_errors():
    (record,) = perfquery.parse(read_sample("perfquery-x_treydock_switch_lid2052_errors.txt"))
    assert (record.lid, record.port) == (2052, 1)
    assert record.counters["LinkDownedCounter"] == 1
    assert record.counters["PortRcvSwitchRelayErrors"] == 7
    assert record.counters["PortXmitDiscards"] == 20046
    assert record.counters["PortXmitData"] == 178791657177235
    assert not record.saturated("PortXmitDiscards")  # 64-bit extended counters do not saturate


def test_rcv_error_details():
    (record,) = perfquery.parse(read_sample("perfquery-E_treydock_rcv_error_details.txt"))
    assert (record.lid, record.port, record.kind, record.cap_mask) == (1719, 1, "rcv_error_details", None)
    assert record.counters == {
        "PortLocalPhysicalErrors": 0, "PortMalformedPktErrors": 0, "PortBufferOverrunErrors": 0,
        "PortDLIDMappingErrors": 0, "PortVLMappingErrors": 0, "PortLoopingErrors": 0,
    }


def test_basic_counters_of_every_port_from_the_real_tool():
    """`perfquery -l 1 255` against ibsim after `PerformanceSet "leaf01"[5]
    PortCounters.SymbolErrorCounter=50`: one block per port, basic 32/16/8-bit counters."""
    records = perfquery.parse(read_sample("perfquery-l_ibsim_leaf01_all_ports.txt"))
    assert [r.port for r in records] == list(range(1, 9))
    assert {r.kind for r in records} == {"basic"} and {r.lid for r in records} == {1}
    port5 = records[4]
    assert port5.counters["SymbolErrorCounter"] == 50
    assert sum(r.counters["SymbolErrorCounter"] for r in records) == 50
    assert port5.counters["PortXmitData"] == 72 * port5.counters["PortXmitPkts"]  # ibsim: MADs only


def test_saturated_basic_counter():
    text = "# Port counters: Lid 3 port 2 (CapMask: 0x1300)\nPortSelect:......2\nSymbolErrorCounter:....65535\nLinkDownedCounter:.....254\n"
    (record,) = perfquery.parse(text)
    assert record.saturated("SymbolErrorCounter")
    assert not record.saturated("LinkDownedCounter")  # 8-bit: 255 is the maximum


def test_crlf_blank_lines_and_bytes():
    text = b"\r\n# Port counters: Lid 3 port 2\r\nPortSelect:......2\r\n\r\n   \r\nPortRcvErrors:....7\r\n"
    (record,) = perfquery.parse(text)
    assert record.counters == {"PortRcvErrors": 7}


def test_empty_output_is_no_records():
    assert perfquery.parse("") == []


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("SymbolErrorCounter:.....0\n", 1, "before any"),
        ("# Port counters: Lid 3 port 2\nSymbolErrorCounter:.....lots\n", 2, "not a number"),
        ("# Port counters: Lid 3 port 2\nibwarn: [123] mad_rpc: _do_madrpc failed\n", 2, "CounterName"),
        ("# Port counters: Lid x port 2\n", 1, "header"),
        ("# Port counters: Lid 3 port 2\nPortSelect:....3\n", 2, "does not match"),
        ("# Port counters: Lid 3 port 2\nPortRcvErrors:..1\nPortRcvErrors:..2\n", 3, "twice"),
    ],
)
def test_malformed_output_names_the_line(text, line, words):
    with pytest.raises(perfquery.PerfqueryError) as info:
        perfquery.parse(text)
    assert info.value.line == line
    assert words in str(info.value) and f"line {line}" in str(info.value)


# --- iblinkinfo -l ------------------------------------------------------------------------


def test_iblinkinfo_line_mode_from_the_real_tool():
    """Captured from ibsim after `Unlink "leaf02"[1]`, `ReLink "leaf02"[1]` (no SM sweep
    since) and `Unlink "leaf02"[2]`: gpu004 is unreachable and gone from the output."""
    ports = linkinfo.parse(read_sample("iblinkinfo-l_ibsim_2leaf_2spine_4hca_edr.txt"))
    assert len(ports) == 35
    by_key = {(p.description, p.port): p for p in ports}
    assert ("gpu004 mlx5_0", 1) not in by_key

    up = by_key[("leaf01", 5)]
    assert (up.guid, up.lid, up.state, up.phys_state, up.width, up.speed) == (0x200000, 1, "Active", "LinkUp", "4X", "25.78125 Gbps")
    assert (up.remote_guid, up.remote_lid, up.remote_port, up.remote_description) == (0x200002, 4, 1, "spine01")
    assert up.active and up.label == "leaf01[5]"

    down = by_key[("leaf02", 2)]
    assert (down.state, down.phys_state, down.width, down.speed, down.remote_guid, down.remote_port) == ("Down", "Polling", "", "", None, None)

    init = by_key[("gpu003 mlx5_0", 1)]
    assert (init.guid, init.state, init.phys_state, init.remote_guid, init.remote_port) == (0x100005, "Initialize", "LinkUp", 0x200001, 1)
    assert not init.active

    states = {}
    for p in ports:
        states[p.state] = states.get(p.state, 0) + 1
    assert states == {"Active": 12, "Down": 21, "Initialize": 2}


def test_iblinkinfo_port_not_available_and_fdr10():
    text = (
        '0x0002c90300a1b2c0 "          SX6036 ib7" 12 3[  ] ==( 4X 10.0 Gbps (FDR10) Active/  LinkUp)==>  '
        '0x0002c90300a1b2d0     14   17[  ] "stage01 mlx4_0" ( )\n'
        '0x0002c90300a1b2c0 "          SX6036 ib7" 12 4[  ] ==( 4X 10.0 Gbps Armed/  LinkUp)==>      "Port not available"\n'
    )
    first, second = linkinfo.parse(text)
    assert (first.speed, first.state, first.remote_description, first.remote_lid) == ("10.0 Gbps (FDR10)", "Active", "stage01 mlx4_0", 14)
    assert (second.state, second.remote_guid) == ("Armed", None)


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("Switch: 0x0000000000200001 leaf02:\n", 1, "without -l"),
        ('0x0000000000200001 "leaf02" 3 1[  ] ==( 4X 25.78125 Gbps Active LinkUp)==>  [  ] "" ( )\n', 1, "physical state"),
        ('\n0x0000000000200001 "leaf02" 3 1[  ] ==(   Down/ Polling)==>  garbage\n', 2, "far end"),
        ("<html>502 Bad Gateway</html>\n", 1, "expected"),
    ],
)
def test_iblinkinfo_malformed_output_names_the_line(text, line, words):
    with pytest.raises(linkinfo.LinkInfoError) as info:
        linkinfo.parse(text)
    assert info.value.line == line and words in str(info.value)
