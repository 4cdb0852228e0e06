"""Parser for the port counters that infiniband-diags' `perfquery` prints.

Pure Python, no Django. One block per port, each opened by a header line:

    # Port counters: Lid 1 port 5 (CapMask: 0x1300)                     perfquery
    # Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 ...)    perfquery -x
    # PortRcvErrorDetails counters: Lid 1719 port 1                    perfquery -E
    SymbolErrorCounter:..............50

`perfquery -l <lid> 255` prints one block per port of the node. The result is a list of
`PortCounters` records; anything that is not a header, a `Name:....value` line or a
blank line is a `PerfqueryError` that names the line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

BASIC, EXTENDED, RCV_ERROR_DETAILS, XMIT_DISCARD_DETAILS = "basic", "extended", "rcv_error_details", "xmit_discard_details"
KIND_BY_TITLE = {
    "Port counters": BASIC,
    "Port extended counters": EXTENDED,
    "PortRcvErrorDetails counters": RCV_ERROR_DETAILS,
    "PortXmitDiscardDetails counters": XMIT_DISCARD_DETAILS,
}
# Fields that select what was read rather than count anything.
SELECTORS = {"PortSelect", "CounterSelect", "CounterSelect2"}

# Widths of the basic (non -x) PortCounters fields (IBA 16.1.3.5). They saturate at
# their maximum instead of wrapping, so a counter stuck at its maximum no longer moves.
BASIC_COUNTER_BITS = {
    "SymbolErrorCounter": 16,
    "LinkErrorRecoveryCounter": 8,
    "LinkDownedCounter": 8,
    "PortRcvErrors": 16,
    "PortRcvRemotePhysicalErrors": 16,
    "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16,
    "PortXmitConstraintErrors": 8,
    "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4,
    "ExcessiveBufferOverrunErrors": 4,
    "QP1Dropped": 16,
    "VL15Dropped": 16,
    "PortXmitData": 32,
    "PortRcvData": 32,
    "PortXmitPkts": 32,
    "PortRcvPkts": 32,
    "PortXmitWait": 32,
}

_HEADER_RE = re.compile(
    r"^#\s*(?P<title>[A-Za-z ]+?counters):\s*Lid\s+(?P<lid>\d+)\s+port\s+(?P<port>\d+)"
    r"(?:\s*\((?P<extra>[^)]*)\))?\s*$"
)
_CAPMASK_RE = re.compile(r"CapMask:\s*(0x[0-9a-fA-F]+)")
_VALUE_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*):\.*(?P<value>\S+)$")


class PerfqueryError(ValueError):
    """perfquery output that cannot be read; `line` is 1-based (0 when not tied to one)."""

    def __init__(self, line: int, message: str):
        self.line = line
        self.message = message
        super().__init__(f"perfquery output line {line}: {message}" if line else f"perfquery output: {message}")


@dataclass
class PortCounters:
    lid: int
    port: int
    kind: str  # basic, extended, rcv_error_details, ... (see KIND_BY_TITLE)
    counters: dict[str, int] = field(default_factory=dict)
    cap_mask: int | None = None
    line: int = 0

    def saturated(self, name: str) -> bool:
        """True when a basic counter sits at its maximum: it stopped counting."""
        bits = BASIC_COUNTER_BITS.get(name)
        if self.kind != BASIC or bits is None or name not in self.counters:
            return False
        return self.counters[name] >= (1 << bits) - 1


def _kind(title: str) -> str:
    title = " ".join(title.split())
    return KIND_BY_TITLE.get(title) or re.sub(r"\W+", "_", title.lower()).strip("_")


def _show(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def parse(output: str | bytes) -> list[PortCounters]:
    """Every block of one perfquery output, in order. Empty output gives an empty list."""
    if isinstance(output, (bytes, bytearray)):
        output = output.decode("utf-8", errors="replace")
    records: list[PortCounters] = []
    current: PortCounters | None = None
    for number, raw in enumerate(output.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _HEADER_RE.match(line)
            if not m:
                raise PerfqueryError(number, f"expected a header such as '# Port counters: Lid N port M', found {_show(line)}")
            cap = _CAPMASK_RE.search(m["extra"] or "")
            current = PortCounters(lid=int(m["lid"]), port=int(m["port"]), kind=_kind(m["title"]),
                                   cap_mask=int(cap[1], 16) if cap else None, line=number)
            records.append(current)
            continue
        m = _VALUE_RE.match(line)
        if not m:
            raise PerfqueryError(number, f"expected 'CounterName:....value', found {_show(line)}")
        if current is None:
            raise PerfqueryError(number, f"counter {m['name']} before any '# ... counters: Lid N port M' header")
        name, text = m["name"], m["value"]
        try:
            value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
        except ValueError:
            raise PerfqueryError(number, f"{name}: value {text!r} is not a number") from None
        if name == "PortSelect":
            if value != current.port:
                raise PerfqueryError(number, f"PortSelect {value} does not match the header's port {current.port}")
            continue
        if name in SELECTORS:
            continue
        if name in current.counters:
            raise PerfqueryError(number, f"counter {name} appears twice in the block for lid {current.lid} port {current.port}")
        current.counters[name] = value
    return records
