"""The ibnetdiscover parser on every real capture we have, and on bad input."""
import io
import os
import re
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from fabric.ibnetdiscover import (
    SWITCH,
    TopologyError,
    host_name_from_description,
    link_gbps,
    parse,
)
from fabric.tiers import infer_tiers
from tests.conftest import read_sample

SHARED = Path(__file__).resolve().parents[3] / "shared" / "samples" / "ib"

# Counts checked by hand against each file (grep -c '^Switch' / '^Ca', port lines / 2,
# host names read off the CA descriptions).
# file: (switches, adapters, aggregation nodes, hosts, links, {tier: count})
SAMPLES = {
    "ibnetdiscover_ibm_2ca_1sw_sdr.txt": (1, 2, 0, 2, 2, {"leaf": 1}),
    "ibnetdiscover_loginoff_8sw_144ca_qdr_fdr10.txt": (8, 144, 0, 144, 192, {"leaf": 6, "spine": 2}),
    "ibnetdiscover_manpage_voltaire_sdr.txt": (2, 4, 0, 0, 7, {"leaf": 2}),
    "ibnetdiscover_nvidia_article_edr_fdr_loopbacks.txt": (2, 6, 0, 5, 10, {"leaf": 2}),
    "ibnetdiscover_nvidia_selene_compute_666sw_4341ca_hdr_railopt.txt.gz": (666, 4341, 666, 469, 12852, {"leaf": 203, "spine": 321, "core": 142}),
    "ibnetdiscover_nvidia_selene_storage_160sw_1247ca_hdr_edr.txt": (160, 1247, 0, 628, 3286, {"leaf": 60, "spine": 64, "core": 36}),
    "ibnetdiscover_nvidia_topograph_dgx_h100_ndr_40sw_582ca_railopt.txt": (40, 582, 40, 122, 1114, {"leaf": 31, "spine": 9}),
    "ibnetdiscover_nvidia_topograph_example-bad_single_ca_gb200.txt": (0, 1, 0, 1, 0, {}),
    "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt": (2, 13, 1, 5, 16, {"leaf": 2}),
    "ibnetdiscover_oracle_sun_dcs36_qdr.txt": (1, 1, 0, 1, 1, {"leaf": 1}),
    "ibnetdiscover_ufm_ndt_director_MCS8500_putty_log_notabs.txt.gz": (400, 2328, 0, 280, 8723, {"leaf": 154, "spine": 160, "core": 86}),
}


def counts(topo):
    adapters = topo.adapters()
    hosts = {host_name_from_description(a.description) for a in adapters if not a.is_aggregation_node} - {None}
    return (
        len(topo.switches()),
        len(adapters),
        sum(a.is_aggregation_node for a in adapters),
        len(hosts),
        len(topo.links),
        dict(Counter(infer_tiers(topo).values())),
    )


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_real_capture_imports_with_hand_checked_counts(name):
    topo = parse(read_sample(name))
    assert counts(topo) == SAMPLES[name]
    assert not topo.dangling_links()


@pytest.mark.skipif(not SHARED.exists(), reason="GPL-3.0 sample read from ../shared only (not copied into tests/data)")
def test_synthetic_k4_n3_fat_tree_has_three_tiers():
    topo = parse(SHARED / "ibnetdiscover_SYNTHETIC_fattree_k4_n3_80sw_128hca_edr.txt")
    assert counts(topo) == (80, 128, 0, 128, 384, {"leaf": 32, "spine": 32, "core": 16})


def test_selene_tiers_match_the_switch_names():
    topo = parse(read_sample("ibnetdiscover_nvidia_selene_compute_666sw_4341ca_hdr_railopt.txt.gz"))
    tiers = infer_tiers(topo)
    by_prefix = Counter()
    for guid, tier in tiers.items():
        name = re.match(r"MF0;([A-Z]+)", topo.nodes[guid].description)[1]
        by_prefix[name, tier] += 1
    assert by_prefix[("LG", "leaf")] == 200
    assert by_prefix[("CSPINE", "spine")] == 320
    assert by_prefix[("CCORE", "core")] == 140
    assert not any(n == "LG" and t != "leaf" for n, t in by_prefix)
    assert not any(n == "CSPINE" and t != "spine" for n, t in by_prefix)


def test_rail_optimized_hosts_spread_over_eight_leaves():
    topo = parse(read_sample("ibnetdiscover_nvidia_selene_compute_666sw_4341ca_hdr_railopt.txt.gz"))
    leaves_of_host = {}
    for link in topo.links:
        for near, far in ((link.a, link.b), (link.b, link.a)):
            node = topo.nodes[near[0]]
            if node.kind != SWITCH and node.description.startswith("luna-0001 "):
                leaves_of_host.setdefault(node.description.split()[1], topo.nodes[far[0]].description)
    rails = {dev: leaf for dev, leaf in leaves_of_host.items() if dev in {f"mlx5_{i}" for i in (0, 1, 2, 3, 6, 7, 8, 9)}}
    assert len(set(rails.values())) == 8  # one leaf per compute rail


def test_putty_capture_with_banner_crlf_stripped_tabs_and_prompt():
    topo = parse(read_sample("ibnetdiscover_ufm_ndt_director_MCS8500_putty_log_notabs.txt.gz"))
    assert topo.generated == "Tue Jun 15 19:06:08 2021"
    assert len(topo.warnings) == 1 and "ignored text after the last record" in topo.warnings[0]
    assert "mgmt-ha-active" in topo.warnings[0]


def test_file_whose_first_line_is_a_tool_error_imports():
    topo = parse(read_sample("ibnetdiscover_nvidia_article_edr_fdr_loopbacks.txt"))
    loopbacks = [lk for lk in topo.links if lk.a[0] == lk.b[0]]
    assert len(loopbacks) == 3  # [1]<->[2], [19]<->[21], [29]<->[30] on the SwitchIB
    assert topo.initiated_from == 0x0002C9030004E938


def test_guids_are_numbers_whatever_the_padding():
    topo = parse(read_sample("ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"))
    # "S-0002c903007b78b0" in quotes and switchguid=0x2c903007b78b0 are the same switch.
    assert 0x2C903007B78B0 in topo.nodes
    sw = topo.nodes[0x2C903007B78B0]
    assert sw.lid == 19 and sw.enhanced_port0 and sw.num_ports == 36


def test_speeds_widths_and_degraded_link():
    topo = parse(read_sample("ibnetdiscover_manpage_voltaire_sdr.txt"))
    widths = Counter((lk.width, lk.speed) for lk in topo.links)
    # Two cables are 1x at one end and 4x at the other: they run at the slower width.
    assert widths == {("4x", "SDR"): 5, ("1x", "SDR"): 2}
    assert link_gbps("4x", "NDR") == 400.0
    assert link_gbps("2x", "HDR") == 100.0
    assert link_gbps("4x", "FDR10") == 40.0
    assert link_gbps("??", "???") is None


def test_multi_port_ca_and_lids():
    topo = parse(read_sample("ibnetdiscover_manpage_voltaire_sdr.txt"))
    ca = topo.nodes[0x8F10403960558]
    assert sorted(ca.ports) == [1, 2]
    assert ca.ports[1].guid == 0x8F10403960559 and ca.ports[1].lid == 10
    assert ca.ports[2].lid == 14


def test_lone_ca_with_no_links():
    topo = parse(read_sample("ibnetdiscover_nvidia_topograph_example-bad_single_ca_gb200.txt"))
    assert [n.description for n in topo.nodes.values()] == ["dgx-gb200-n01-c1 HCA-1"]
    assert topo.links == []


@pytest.mark.parametrize(
    "description, host",
    [
        ("gpu001 mlx5_0", "gpu001"),
        ("selene-cache-02 mlx5_1 ", "selene-cache-02"),
        ("Hca0", "Hca0"),
        ("MT23108 InfiniHost Mellanox Technologies", None),
        ("Mellanox Technologies Aggregation Node", None),
        ("", None),
    ],
)
def test_host_name_from_description(description, host):
    assert host_name_from_description(description) == host


TINY = b"""#
# Topology file: generated on Wed Dec  2 13:37:59 2026
#
vendid=0x0
devid=0x0
switchguid=0x200000(200000)
Switch\t8 "S-0000000000200000"\t\t# "leaf01" base port 0 lid 1 lmc 0
[1]\t"H-0000000000100000"[1](100001) \t\t# "gpu001 mlx5_0" lid 2 4xEDR
[5]\t"S-0000000000200001"[1]\t\t# "spine01" lid 3 4xEDR

vendid=0x0
devid=0x0
caguid=0x100000
Ca\t1 "H-0000000000100000"\t\t# "gpu001 mlx5_0"
[1](100001) \t"S-0000000000200000"[1]\t\t# lid 2 lmc 0 "leaf01" lid 1 4xEDR
"""


def test_far_end_never_seen_is_dangling_with_a_warning():
    topo = parse(TINY)
    assert len(topo.links) == 2
    [dangling] = topo.dangling_links()
    assert dangling.b == (0x200001, 1)
    assert len(topo.warnings) == 1
    assert "'leaf01'[5]" in topo.warnings[0] and "0x0000000000200001[1]" in topo.warnings[0] and "dangling" in topo.warnings[0]


@pytest.mark.parametrize(
    "data, line, words",
    [
        (TINY[: TINY.index(b"(100001) \t\"S-") + 5], 15, "malformed port line"),
        (b"#\n[1]\t\"S-0000000000200000\"[1]\t\t# \"x\" lid 1 4xEDR\n", 2, "port line outside a node record"),
        (TINY + b"\n" + TINY[TINY.index(b"vendid"):TINY.index(b"\n\nvendid")] + b"\n", 20, "duplicate node GUID 0x0000000000200000"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", 1, "binary data"),
        (b"", 0, "no Switch or Ca records"),
        (b"#\nvendid=0x2c9\ndevid=0x1\n", 2, "truncated"),
        (b"#\nswitchguid=0x10(10)\nSwitch\t8 \"S-0000000000000011\"\t\t# \"x\" base port 0 lid 1 lmc 0\n", 3, "differs from the 'switchguid=' line"),
        (TINY.replace(b"[5]\t", b"[300]\t"), 9, "out of range"),
        (TINY.replace(b"lid 2 lmc 0 \"leaf01\"", b"lid 2 lmc 0 \"leaf01\"") + b"garbage line\nmore garbage\n", 16, "expected a node record"),
        (b"hello\nworld\n" * 10, 6, "not a topology file"),
    ],
    ids=["truncated", "port-before-node", "duplicate-guid", "binary", "empty", "ids-without-node", "guid-mismatch", "port-range", "junk-after", "not-topology"],
)
def test_bad_input_is_refused_with_line_and_reason(data, line, words):
    with pytest.raises(TopologyError) as info:
        parse(data)
    assert info.value.line == line, str(info.value)
    assert words in str(info.value)


class EndlessGarbage(io.RawIOBase):
    """100 MB of printable garbage, produced lazily so the test itself stays small."""

    def __init__(self, total=100 * 1024 * 1024, newline_every=200):
        self.left = total
        self.newline_every = newline_every
        self.read_bytes = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        n = min(len(buffer), self.left)
        start = self.read_bytes
        buffer[:n] = bytes(10 if (start + i + 1) % self.newline_every == 0 else 120 for i in range(n))
        self.left -= n
        self.read_bytes += n
        return n


@pytest.mark.parametrize("newline_every", [200, 10**9], ids=["many-lines", "one-huge-line"])
def test_100_mb_of_garbage_is_refused_quickly_in_bounded_memory(newline_every):
    raw = EndlessGarbage(newline_every=newline_every)
    stream = io.BufferedReader(raw)
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(TopologyError):
        parse(stream)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert raw.read_bytes < 1024 * 1024, "the parser should give up long before reading 100 MB"
    assert peak < 4 * 1024 * 1024
    assert elapsed < 5  # generous: it reads a few kilobytes


def test_parse_reads_paths_and_file_objects(tmp_path):
    path = tmp_path / "topo.txt"
    path.write_bytes(TINY)
    assert len(parse(path).nodes) == 2
    assert len(parse(str(path)).nodes) == 2
    with open(path, "rb") as fh:
        assert len(parse(fh).nodes) == 2
    assert os.path.exists(path)
