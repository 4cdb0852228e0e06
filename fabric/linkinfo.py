"""Parser for `iblinkinfo -l` (line mode): one line per port of every node the tool
reached, with the port's state and its peer. Pure Python, no Django.

    0x<port guid> "<desc, right-aligned to 30>"  <lid> <port>[<ext>] ==(<width> <speed> <state>/<phys>)==>  <peer>

where <peer> is `0x<guid> <lid> <port>[<ext>] "<desc>" (<hints>)` for a connected port,
`[  ] "" ( )` for a down one and `"Port not available"` when the tool could not read it
(rdma-core infiniband-diags/iblinkinfo.c, print_port). The GUIDs are *port* GUIDs; on a
switch every port shares the port-0 GUID, which is usually the node GUID.

A port whose peer was unplugged shows `Down/Polling`; the peer itself disappears from
the output when nothing else reaches it (a host behind a single cable).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ACTIVE = "Active"

_LINE_RE = re.compile(
    r'^0x(?P<guid>[0-9a-fA-F]{1,16})\s+"(?P<desc>.*)"\s+(?P<lid>\d+)\s+(?P<port>\d+)\[(?P<ext>[^\]]*)\]\s*'
    r"==\((?P<link>[^)]*(?:\([^)]*\)[^)]*)?)\)==>\s*(?P<peer>.*)$"
)
_LINK_RE = re.compile(r"^(?:(?P<width>\S+)\s+(?P<speed>.+?)\s+)?(?P<state>[A-Za-z?()0-9]+)/\s*(?P<phys>[A-Za-z?()0-9]+)$")
_PEER_RE = re.compile(
    r'^(?:0x(?P<guid>[0-9a-fA-F]{1,16})\s+)?(?P<lid>\d+)\s+(?P<port>\d+)\[(?P<ext>[^\]]*)\]\s+"(?P<desc>.*)"\s*\((?P<hints>.*)\)$'
)
_NO_PEER_RE = re.compile(r'^\[\s*\]\s+""\s+\(\s*\)$')
_NOT_AVAILABLE = '"Port not available"'


class LinkInfoError(ValueError):
    """iblinkinfo output that cannot be read; `line` is 1-based."""

    def __init__(self, line: int, message: str):
        self.line = line
        self.message = message
        super().__init__(f"iblinkinfo output line {line}: {message}" if line else f"iblinkinfo output: {message}")


@dataclass
class PortLink:
    guid: int  # port GUID of this port (for a switch: its port-0 GUID)
    description: str
    lid: int
    port: int
    state: str  # Active, Down, Initialize, Armed, ...
    phys_state: str  # LinkUp, Polling, Disabled, ...
    width: str = ""  # "4X"; empty while down
    speed: str = ""  # per-lane rate as printed, "25.78125 Gbps"; empty while down
    remote_guid: int | None = None
    remote_lid: int | None = None
    remote_port: int | None = None
    remote_description: str = ""
    line: int = 0

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    @property
    def label(self) -> str:
        return f"{self.description}[{self.port}]"


def _show(text: str, limit: int = 100) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def parse(output: str | bytes) -> list[PortLink]:
    if isinstance(output, (bytes, bytearray)):
        output = output.decode("utf-8", errors="replace")
    ports: list[PortLink] = []
    for number, raw in enumerate(output.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        m = _LINE_RE.match(line)
        if not m:
            hint = " (was iblinkinfo run without -l?)" if line.endswith(":") and line.split(":")[0] in ("Switch", "CA", "Router") else ""
            raise LinkInfoError(number, f"expected '0x<guid> \"<description>\" <lid> <port>[..] ==(...)==> ...'{hint}, found {_show(line)}")
        link = _LINK_RE.match(m["link"].strip())
        if not link:
            raise LinkInfoError(number, f"expected '(<width> <speed> <state>/<physical state>)', found {_show('(' + m['link'] + ')')}")
        record = PortLink(
            guid=int(m["guid"], 16), description=m["desc"].strip(), lid=int(m["lid"]), port=int(m["port"]),
            state=link["state"], phys_state=link["phys"], width=link["width"] or "", speed=(link["speed"] or "").strip(),
            line=number,
        )
        peer = m["peer"].strip()
        if p := _PEER_RE.match(peer):
            record.remote_guid = int(p["guid"], 16) if p["guid"] else None
            record.remote_lid = int(p["lid"])
            record.remote_port = int(p["port"])
            record.remote_description = p["desc"].strip()
        elif not (_NO_PEER_RE.match(peer) or peer == _NOT_AVAILABLE):
            raise LinkInfoError(number, f"cannot read the far end of the port: {_show(peer)}")
        if record.port > 255:
            raise LinkInfoError(number, f"port number {record.port} out of range 0..255")
        ports.append(record)
    return ports
