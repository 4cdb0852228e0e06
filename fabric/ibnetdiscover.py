"""Parser for the topology file that infiniband-diags' `ibnetdiscover` writes.

Pure Python, no Django: bytes in, a `Topology` (nodes and de-duplicated links) out, or a
`TopologyError` that names the line and what was expected. The grammar is what rdma-core's
`ibnetdiscover.c` prints (out_switch, out_ca, out_switch_port, out_ca_port); real captures
add noise that we accept: stderr lines or a PuTTY banner before the header, CRLF endings, TABs stripped, blank lines
holding spaces, `Non-Chassis Nodes` and chassis lines from `-g`.

Memory stays bounded whatever the input: lines are read with a length limit, and junk
before the first record is tolerated for a few lines only, so 100 MB of garbage is refused
after reading a few kilobytes.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

MAX_LINE_BYTES = 64 * 1024
MAX_PREAMBLE_LINES = 5

SWITCH, CA, ROUTER = "switch", "ca", "router"
NODE_TYPE_BY_LETTER = {"S": SWITCH, "H": CA, "R": ROUTER}
NODE_TYPE_BY_KEYWORD = {"Switch": SWITCH, "Ca": CA, "Rt": ROUTER}
GUID_KEY_BY_TYPE = {SWITCH: "switchguid", CA: "caguid", ROUTER: "rtguid"}

WIDTHS = {"1x": 1, "2x": 2, "4x": 4, "8x": 8, "12x": 12}
# Per-lane data rate in Gb/s after line encoding (8b/10b up to QDR, 64b/66b from FDR10).
LANE_GBPS = {
    "SDR": 2.0,
    "DDR": 4.0,
    "QDR": 8.0,
    "FDR10": 10.0,
    "FDR": 13.64,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
AGGREGATION_NODE_DESCRIPTION = "Mellanox Technologies Aggregation Node"

_HEX = r"[0-9a-fA-F]{1,16}"
_ID_RE = re.compile(
    rf"^(?P<key>vendid|devid|sysimgguid|switchguid|caguid|rtguid)=0x(?P<value>{_HEX})"
    rf"(?:\((?P<port0>{_HEX})\))?\s*(?:#.*)?$"
)
_NODE_RE = re.compile(
    rf'^(?P<kind>Switch|Ca|Rt)\s*(?P<nports>\d+)\s*"(?P<letter>[SHR?])-(?P<guid>{_HEX})"'
    r'\s*#\s*"(?P<desc>.*)"(?P<rest>[^"]*)$'
)
_SWITCH_REST_RE = re.compile(r"(?P<p0>base|enhanced)\s+port\s+0\s+lid\s+(?P<lid>\d+)\s+lmc\s+(?P<lmc>\d+)")
_PORT_RE = re.compile(
    rf"^\[(?P<lport>\d+)\](?:\((?P<lguid>{_HEX})\))?(?:\[ext \d+\])?\s*"
    rf'"(?P<rletter>[SHR?])-(?P<rguid>{_HEX})"\[(?P<rport>\d+)\](?:\[ext \d+\])?\s*'
    rf"(?:\((?P<rpguid>{_HEX})\))?\s*"
    r"(?:#\s*(?:lid\s+(?P<llid>\d+)\s+lmc\s+(?P<llmc>\d+)\s+)?"
    r'"(?P<rdesc>.*)"\s+lid\s+(?P<rlid>\d+)\s+(?P<width>\d+x|\?\?)(?P<speed>[A-Z0-9]+|\?\?\?)(?P<rest>[^"]*))?$'
)
_GENERATED_RE = re.compile(r"^#\s*Topology file: generated (?:on|with) (?P<when>.*)$")
_INITIATED_RE = re.compile(rf"^#\s*Initiated from node (?P<node>{_HEX}) port (?P<port>{_HEX})")
_CHASSIS_RE = re.compile(r"^(Non-Chassis Nodes|Chassis \d+.*)$")


class TopologyError(ValueError):
    """A topology file that cannot be imported; `line` is 1-based (0 when not tied to one)."""

    def __init__(self, line: int, message: str):
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line else message)


@dataclass
class Port:
    number: int
    guid: int | None = None
    lid: int | None = None


@dataclass
class Node:
    kind: str
    guid: int
    description: str
    num_ports: int
    line: int
    vendor_id: int | None = None
    device_id: int | None = None
    system_image_guid: int | None = None
    lid: int | None = None  # switches: the port-0 LID shared by all ports
    lmc: int | None = None
    enhanced_port0: bool | None = None
    ports: dict[int, Port] = field(default_factory=dict)

    @property
    def is_aggregation_node(self) -> bool:
        """SHARP aggregation nodes are CAs inside a switch: adapters, never hosts."""
        return self.kind == CA and self.description.strip() == AGGREGATION_NODE_DESCRIPTION

    def port(self, number: int) -> Port:
        port = self.ports.get(number)
        if port is None:
            port = self.ports[number] = Port(number)
        return port


@dataclass
class Link:
    """One cable. `a` is the end whose block listed it first; ends are (node GUID, port)."""

    a: tuple[int, int]
    b: tuple[int, int]
    width: str | None
    speed: str | None
    line: int
    b_kind: str = SWITCH
    b_description: str = ""

    @property
    def key(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    @property
    def gbps(self) -> float | None:
        return link_gbps(self.width, self.speed)


@dataclass
class Topology:
    nodes: dict[int, Node] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    generated: str = ""
    initiated_from: int | None = None

    def switches(self):
        return [n for n in self.nodes.values() if n.kind == SWITCH]

    def adapters(self):
        return [n for n in self.nodes.values() if n.kind != SWITCH]

    def dangling_links(self):
        return [lk for lk in self.links if lk.a[0] not in self.nodes or lk.b[0] not in self.nodes]


def link_gbps(width: str | None, speed: str | None) -> float | None:
    lanes = WIDTHS.get(width or "")
    per_lane = LANE_GBPS.get(speed or "")
    if lanes is None or per_lane is None:
        return None
    return round(lanes * per_lane, 2)


def host_name_from_description(description: str) -> str | None:
    """`gpu001 mlx5_0` -> `gpu001`. A one-word description is the host itself (synthetic
    fabrics name CAs `Hca0`); vendor defaults such as `MT23108 InfiniHost Mellanox
    Technologies` and SHARP aggregation nodes name no host."""
    text = description.strip()
    if not text or text == AGGREGATION_NODE_DESCRIPTION:
        return None
    words = text.split()
    if len(words) == 1:
        return words[0]
    if len(words) == 2:
        return words[0]
    return None


def format_guid(guid: int) -> str:
    return f"0x{guid:016x}"


def _lines(stream):
    """Yield (number, text) with a bound on line length and a check for binary data."""
    number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise TopologyError(number, f"line longer than {MAX_LINE_BYTES // 1024} KiB: not an ibnetdiscover topology file")
        if b"\x00" in raw:
            raise TopologyError(number, "binary data (NUL byte): not an ibnetdiscover topology file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
            if sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\r\n") > 0:
                raise TopologyError(number, "binary data (control bytes): not an ibnetdiscover topology file") from None
        yield number, text.rstrip("\r\n").rstrip("\r")


def _show(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def parse(source) -> Topology:
    """Parse a topology given as bytes (its content), a binary file object, or a path."""
    if isinstance(source, (bytes, bytearray)):
        return _parse_stream(io.BytesIO(source))
    if hasattr(source, "readline"):
        return _parse_stream(source)
    with open(source, "rb") as stream:
        return _parse_stream(stream)


def _parse_stream(stream) -> Topology:
    topo = Topology()
    started = False
    pending: dict[str, tuple[int, int | None, int]] = {}  # id key -> (value, port0 guid, line)
    node: Node | None = None
    seen_ends: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
    links_by_key: dict = {}
    last_line = 0
    trailer: tuple[int, str] | None = None  # an unknown line, forgiven only if nothing follows

    for number, line in _lines(stream):
        last_line = number
        stripped = line.strip()
        if not stripped:
            node = None if not pending else node
            continue
        if trailer is not None:
            raise _unexpected(*trailer)
        if stripped.startswith("#"):
            started = True
            if m := _GENERATED_RE.match(stripped):
                topo.generated = m["when"].strip()
            elif m := _INITIATED_RE.match(stripped):
                topo.initiated_from = int(m["node"], 16)
            continue
        if _CHASSIS_RE.match(stripped):
            started = True
            continue
        if m := _ID_RE.match(stripped):
            started = True
            key = m["key"]
            if key in pending:
                raise TopologyError(number, f"second '{key}=' line before the Switch/Ca record it belongs to")
            pending[key] = (int(m["value"], 16), int(m["port0"], 16) if m["port0"] else None, number)
            node = None
            continue
        if m := _NODE_RE.match(stripped):
            started = True
            node = _start_node(topo, m, pending, number)
            pending = {}
            continue
        if stripped.startswith("["):
            if m := _PORT_RE.match(stripped):
                if node is None:
                    raise TopologyError(number, "port line outside a node record: expected a 'Switch', 'Ca' or 'Rt' line before it")
                _add_port_line(topo, node, m, number, seen_ends, links_by_key)
                continue
            raise TopologyError(
                number,
                'malformed port line: expected [port] "S-<guid>"[port] # "description" lid N <width><speed>, found '
                + _show(stripped),
            )
        if not started and number <= MAX_PREAMBLE_LINES:
            continue  # stderr noise or a terminal banner before the header
        if not started:
            raise TopologyError(number, "no ibnetdiscover header or node record in the first lines: not a topology file")
        trailer = (number, stripped)  # a terminal prompt after the last record is common

    if trailer is not None:
        topo.warnings.append(f"line {trailer[0]}: ignored text after the last record: {_show(trailer[1])}")

    if pending:
        first = min(line for _, _, line in pending.values())
        raise TopologyError(first, "file ends after 'vendid=/devid=' lines without their Switch/Ca record: truncated file?")
    if not topo.nodes:
        raise TopologyError(last_line if last_line else 0, "no Switch or Ca records found: empty or not an ibnetdiscover topology file")
    topo.links = list(links_by_key.values())
    for link in topo.dangling_links():
        far = link.b if link.a[0] in topo.nodes else link.a
        near = link.a if far is link.b else link.b
        near_node = topo.nodes[near[0]]
        topo.warnings.append(
            f"line {link.line}: link {near_node.description!r}[{near[1]}] -> {format_guid(far[0])}[{far[1]}] "
            f"({link.b_description!r}): far end never appears as a node; imported as dangling"
        )
    return topo


def _unexpected(number: int, text: str) -> TopologyError:
    return TopologyError(
        number,
        "expected a node record (vendid=/devid=/sysimgguid=/switchguid=/caguid= lines, then a "
        "'Switch', 'Ca' or 'Rt' line), a port line '[N] ...', a '#' comment or a blank line; found " + _show(text),
    )


def _start_node(topo: Topology, m: re.Match, pending: dict, number: int) -> Node:
    kind = NODE_TYPE_BY_KEYWORD[m["kind"]]
    guid = int(m["guid"], 16)
    letter_kind = NODE_TYPE_BY_LETTER.get(m["letter"])
    if letter_kind is not None and letter_kind != kind:
        raise TopologyError(number, f"{m['kind']} record named {m['letter']}-{m['guid']}: the name's type letter does not match")
    guid_key = GUID_KEY_BY_TYPE[kind]
    declared = pending.get(guid_key)
    if declared is not None and declared[0] != guid:
        raise TopologyError(
            number, f"{m['kind']} GUID {format_guid(guid)} differs from the '{guid_key}=' line above it ({format_guid(declared[0])})"
        )
    for other_kind, other_key in GUID_KEY_BY_TYPE.items():
        if other_kind != kind and other_key in pending:
            raise TopologyError(number, f"'{other_key}=' line (line {pending[other_key][2]}) before a {m['kind']} record")
    if guid in topo.nodes:
        raise TopologyError(number, f"duplicate node GUID {format_guid(guid)}: first defined at line {topo.nodes[guid].line}")
    node = Node(
        kind=kind,
        guid=guid,
        description=m["desc"],
        num_ports=int(m["nports"]),
        line=number,
        vendor_id=pending["vendid"][0] if "vendid" in pending else None,
        device_id=pending["devid"][0] if "devid" in pending else None,
        system_image_guid=pending["sysimgguid"][0] if "sysimgguid" in pending else None,
    )
    if kind == SWITCH:
        if sw := _SWITCH_REST_RE.search(m["rest"]):
            node.lid = int(sw["lid"])
            node.lmc = int(sw["lmc"])
            node.enhanced_port0 = sw["p0"] == "enhanced"
        port0 = declared[1] if declared is not None else None
        node.port(0).guid = port0 if port0 is not None else guid
        node.port(0).lid = node.lid
    topo.nodes[guid] = node
    return node


def _add_port_line(topo: Topology, node: Node, m: re.Match, number: int, seen_ends: dict, links_by_key: dict):
    local_port = int(m["lport"])
    remote_port = int(m["rport"])
    if local_port == 0 or local_port > 255 or remote_port > 255:
        raise TopologyError(number, f"port number out of range 1..255: [{local_port}] -> [{remote_port}]")
    remote_guid = int(m["rguid"], 16)
    remote_kind = NODE_TYPE_BY_LETTER.get(m["rletter"], CA)
    port = node.port(local_port)
    if node.kind == SWITCH:
        port.guid = node.ports[0].guid
        port.lid = node.lid
    else:
        if m["lguid"]:
            port.guid = int(m["lguid"], 16)
        if m["llid"]:
            port.lid = int(m["llid"])
    width = m["width"] if m["width"] in WIDTHS else None
    speed = m["speed"] if m["speed"] in LANE_GBPS else None
    near, far = (node.guid, local_port), (remote_guid, remote_port)
    if near == far:
        raise TopologyError(number, f"port [{local_port}] is cabled to itself")
    key = (near, far) if near <= far else (far, near)
    existing = links_by_key.get(key)
    if existing is not None:
        # The other end's block lists the same cable again. Each end prints its own active
        # width and speed; when they disagree, the cable runs at the slower of the two.
        if existing.gbps is None or (link_gbps(width, speed) or existing.gbps) < existing.gbps:
            existing.width = width or existing.width
            existing.speed = speed or existing.speed
        return
    for end, other in ((near, far), (far, near)):
        if end in seen_ends and seen_ends[end][0] != other:
            prev_other, prev_line = seen_ends[end]
            topo.warnings.append(
                f"line {number}: port {format_guid(end[0])}[{end[1]}] is cabled to both "
                f"{format_guid(prev_other[0])}[{prev_other[1]}] (line {prev_line}) and "
                f"{format_guid(other[0])}[{other[1]}]; kept the first"
            )
            return
    seen_ends[near] = (far, number)
    seen_ends[far] = (near, number)
    links_by_key[key] = Link(
        a=near,
        b=far,
        width=width,
        speed=speed,
        line=number,
        b_kind=remote_kind,
        b_description=m["rdesc"] or "",
    )
    if m["rpguid"] and remote_guid not in topo.nodes:
        topo.nodes.get(remote_guid)  # remote port GUID is recorded when its own block arrives
