"""Synthetic fat-tree fabrics for demos, tests and benchmarks (pure Python, no Django).

`build(...)` returns a `FatTree`: an `ibnetdiscover.Topology` (the same dataclasses the
parser returns, so `importer.import_topology` takes it unchanged) plus the hosts.

Shapes
  * 2-tier (pods 0 or 1): every leaf has one cable to every spine.
  * 3-tier (pods P > 1): leaves and spines are split evenly into P pods; a leaf has one
    cable to every spine of its pod, and every spine one cable to every core switch.
  * rail-optimized (hcas_per_host R > 1): leaves come in groups of R consecutive leaves
    (one per rail); HCA r (`mlx5_r`) of every host in a group is cabled to the group's
    rail-r leaf, so each leaf still has hosts_per_leaf cables down and hosts = L / R * H.

Names (node descriptions; numbers are 1-based and global, zero-padded to the same width)
  * 2-tier: `leaf001`, `spine01`; 3-tier: `p2-leaf017`, `p2-spine05` (pod prefix, global
    number, so the number alone still names one switch), cores `core01`.
  * hosts `gpu0001`; their adapters `gpu0001 mlx5_0`, `gpu0001 mlx5_1`, ... as a real host
    names them, which is how the importer finds the host name.

Ports: a leaf's hosts come first (1..H), then its uplinks in spine order; a spine's leaves
first, then its cores; a core's spines in order. GUIDs are fixed by position
(0xfab0 | tier | number), so rebuilding with the same parameters gives the same fabric.

`to_ibnetdiscover(topology)` writes the text ibnetdiscover prints (parse() reads it back to
an equal topology); `to_ibsim_net(fattree)` writes a net file for the ibsim simulator.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .ibnetdiscover import CA, LANE_GBPS, ROUTER, SWITCH, WIDTHS, Link, Node, Port, Topology

GUID_PREFIX = 0xFAB0 << 48
KIND_LEAF, KIND_SPINE, KIND_CORE, KIND_CA = 1, 2, 3, 4
VENDOR_ID = 0x2C9  # Mellanox/NVIDIA, as every real sample
SWITCH_DEVICE_ID = 0xD2F2  # Quantum-2 (QM9700)
CA_DEVICE_ID = 0x1021  # ConnectX-7
MAX_PORTS = 255  # the most a topology file (and the parser) allows
MAX_UNICAST_LID = 0xBFFF
MAX_HCAS_PER_HOST = 64  # the GUID keeps 8 bits for the rail (node and port GUID per HCA)
MAX_GPUS_PER_HOST = 1024
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_GPU_MEMORY_MIB = 81559  # what nvidia-smi reports for an H100 80GB

# ibsim 0.10 port flags: s= LinkSpeedEnabled (1 SDR, 2 DDR, 4 QDR), e= LinkSpeedExtEnabled
# (1 FDR, 2 EDR, 4 HDR), w= LinkWidthEnabled (1 1X, 2 4X, 4 8X, 8 12X, 16 2X).
IBSIM_SPEED_FLAGS = {
    "SDR": "s=1 e=0",
    "DDR": "s=2 e=0",
    "QDR": "s=4 e=0",
    "FDR10": "s=4 e=0",  # FDR10 is a Mellanox extension ibsim lacks: runs as QDR
    "FDR": "s=4 e=1",
    "EDR": "s=4 e=2",
    "HDR": "s=4 e=4",
}
IBSIM_MISSING_SPEEDS = {"NDR": "HDR", "XDR": "HDR", "FDR10": "QDR"}
IBSIM_WIDTH_FLAGS = {"1x": 1, "4x": 2, "8x": 4, "12x": 8, "2x": 16}


@dataclass(frozen=True)
class SyntheticHost:
    name: str
    devices: tuple[str, ...]  # mlx5_0, mlx5_1, ... one per HCA (rail)
    adapter_guids: tuple[int, ...]
    leaves: tuple[str, ...]  # the leaf of each HCA, same order as devices


@dataclass
class FatTree:
    topology: Topology
    spines: int
    leaves: int
    hosts_per_leaf: int
    gpus_per_host: int
    hcas_per_host: int
    pods: int
    cores: int
    speed: str
    width: str
    hosts: list[SyntheticHost] = field(default_factory=list)

    @property
    def tiers(self) -> int:
        return 3 if self.pods > 1 else 2

    def describe(self) -> str:
        shape = f"{self.pods} pods, {self.cores} cores, " if self.tiers == 3 else ""
        rails = f", {self.hcas_per_host} rails" if self.hcas_per_host > 1 else ""
        return (
            f"{self.tiers}-tier fat tree: {shape}{self.spines} spines, {self.leaves} leaves, "
            f"{self.hosts_per_leaf} hosts per leaf{rails}, {len(self.hosts)} hosts x {self.gpus_per_host} GPUs, "
            f"{self.width}{self.speed}"
        )


def _positive(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def normalise_speed(speed) -> str:
    text = str(speed).strip().upper()
    if text not in LANE_GBPS:
        raise ValueError(f"unknown speed {speed!r}: expected one of {', '.join(LANE_GBPS)}")
    return text


def normalise_width(width) -> str:
    text = str(width).strip().lower()
    if text not in WIDTHS:
        raise ValueError(f"unknown width {width!r}: expected one of {', '.join(WIDTHS)}")
    return text


def guid(kind: int, number: int, sub: int = 0) -> int:
    return GUID_PREFIX | kind << 40 | number << 8 | sub


def build(
    spines: int,
    leaves: int,
    hosts_per_leaf: int,
    gpus_per_host: int = 8,
    hcas_per_host: int = 1,
    pods: int = 0,
    cores: int | None = None,
    speed: str = "NDR",
    width: str = "4x",
) -> FatTree:
    """Build the fabric; ValueError names the first parameter that does not fit."""
    S = _positive("spines", spines)
    L = _positive("leaves", leaves)
    H = _positive("hosts_per_leaf", hosts_per_leaf)
    G = _positive("gpus_per_host", gpus_per_host, maximum=MAX_GPUS_PER_HOST)
    R = _positive("hcas_per_host", hcas_per_host, maximum=MAX_HCAS_PER_HOST)
    P = _positive("pods", pods, minimum=0)
    speed, width = normalise_speed(speed), normalise_width(width)
    if L % R:
        raise ValueError(f"leaves ({L}) must be a multiple of hcas_per_host ({R}): rail-optimized leaves come in groups of one leaf per rail")
    three_tier = P > 1
    if not three_tier:
        if cores is not None:
            raise ValueError("cores apply only to a 3-tier fabric (pods > 1)")
        P, C = 1, 0
    else:
        if L % P:
            raise ValueError(f"leaves ({L}) must divide evenly into {P} pods")
        if S % P:
            raise ValueError(f"spines ({S}) must divide evenly into {P} pods")
        if (L // P) % R:
            raise ValueError(f"leaves per pod ({L // P}) must be a multiple of hcas_per_host ({R}) so that a host's rails stay in one pod")
        C = S // P if cores is None else _positive("cores", cores)
    Lp, Sp = L // P, S // P
    for what, ports in (("leaf", H + Sp), ("spine", Lp + C), ("core", S if three_tier else 0)):
        if ports > MAX_PORTS:
            raise ValueError(f"a {what} switch would need {ports} ports; at most {MAX_PORTS}")
    n_hosts = L // R * H
    if L + S + C + n_hosts * R > MAX_UNICAST_LID:
        raise ValueError(f"{L + S + C + n_hosts * R} nodes do not fit the {MAX_UNICAST_LID} unicast LIDs of one subnet")

    def number(n: int, total: int, digits: int) -> str:
        return str(n).zfill(max(digits, len(str(total))))

    def pod_prefix(pod: int) -> str:
        return f"p{pod + 1}-" if three_tier else ""

    topo = Topology(generated=f"fabricpool fattree (S={S} L={L} H={H} R={R} P={P if three_tier else 0} C={C} {width}{speed})")
    lid = iter(range(1, MAX_UNICAST_LID + 1))

    def add_switch(kind: int, n: int, name: str, ports: int) -> Node:
        g = guid(kind, n)
        node = Node(kind=SWITCH, guid=g, description=name, num_ports=ports, line=0, vendor_id=VENDOR_ID,
                    device_id=SWITCH_DEVICE_ID, system_image_guid=g, lid=next(lid), lmc=0, enhanced_port0=True)
        node.ports[0] = Port(0, g, node.lid)
        topo.nodes[g] = node
        return node

    leaf_nodes = [add_switch(KIND_LEAF, i + 1, f"{pod_prefix(i // Lp)}leaf{number(i + 1, L, 3)}", H + Sp) for i in range(L)]
    spine_nodes = [add_switch(KIND_SPINE, j + 1, f"{pod_prefix(j // Sp)}spine{number(j + 1, S, 2)}", Lp + C) for j in range(S)]
    core_nodes = [add_switch(KIND_CORE, k + 1, f"core{number(k + 1, C, 2)}", S) for k in range(C)]

    # Adapters are created before any link so that every switch keeps its LID order.
    hosts = []
    adapters: list[tuple[Node, Node, int]] = []  # (adapter, leaf, leaf port)
    for h in range(n_hosts):
        name = f"gpu{number(h + 1, n_hosts, 4)}"
        group, slot = divmod(h, H)
        devices, guids, host_leaves = [], [], []
        for r in range(R):
            g = guid(KIND_CA, h + 1, 2 * r)
            device = f"mlx5_{r}"
            ca = Node(kind=CA, guid=g, description=f"{name} {device}", num_ports=1, line=0, vendor_id=VENDOR_ID,
                      device_id=CA_DEVICE_ID, system_image_guid=g)
            ca.ports[1] = Port(1, g + 1, next(lid))
            topo.nodes[g] = ca
            leaf = leaf_nodes[group * R + r]
            adapters.append((ca, leaf, slot + 1))
            devices.append(device)
            guids.append(g)
            host_leaves.append(leaf.description)
        hosts.append(SyntheticHost(name, tuple(devices), tuple(guids), tuple(host_leaves)))

    def cable(x: Node, xp: int, y: Node, yp: int):
        """`x` is the end ibnetdiscover lists first (switches in creation order, then CAs)."""
        for node, port in ((x, xp), (y, yp)):
            if node.kind == SWITCH:
                node.ports[port] = Port(port, node.guid, node.lid)
        topo.links.append(Link(a=(x.guid, xp), b=(y.guid, yp), width=width, speed=speed, line=0,
                               b_kind=y.kind, b_description=y.description))

    by_leaf: dict[int, list[tuple[Node, int]]] = {leaf.guid: [] for leaf in leaf_nodes}
    for ca, leaf, port in adapters:
        by_leaf[leaf.guid].append((ca, port))
    # Links in the order the parser meets them: leaf blocks, then spine blocks.
    for i, leaf in enumerate(leaf_nodes):
        for ca, port in sorted(by_leaf[leaf.guid], key=lambda item: item[1]):
            cable(leaf, port, ca, 1)
        pod = i // Lp
        for j in range(Sp):
            cable(leaf, H + 1 + j, spine_nodes[pod * Sp + j], 1 + i % Lp)
    for j, spine in enumerate(spine_nodes):
        for k, core in enumerate(core_nodes):
            cable(spine, Lp + 1 + k, core, j + 1)

    topo.initiated_from = adapters[0][0].guid
    return FatTree(topology=topo, spines=S, leaves=L, hosts_per_leaf=H, gpus_per_host=G, hcas_per_host=R,
                   pods=P if three_tier else 0, cores=C, speed=speed, width=width, hosts=hosts)


# -- text output -------------------------------------------------------------------------------

_LETTER = {SWITCH: "S", CA: "H", ROUTER: "R"}


def _ends(topo: Topology) -> dict[int, list[tuple[int, tuple[int, int], Link]]]:
    """{node guid: [(local port, remote end, link)]} sorted by port, each cable at both ends."""
    ends: dict[int, list] = {g: [] for g in topo.nodes}
    for link in topo.links:
        for near, far in ((link.a, link.b), (link.b, link.a)):
            if near[0] in ends:
                ends[near[0]].append((near[1], far, link))
    for items in ends.values():
        items.sort(key=lambda item: item[0])
    return ends


def _rate(link: Link) -> str:
    return f"{link.width or '??'}{link.speed or '???'}"


def _port_lid(node: Node | None, port: int) -> int:
    if node is None:
        return 0
    if node.kind == SWITCH:
        return node.lid or 0
    p = node.ports.get(port)
    return (p.lid if p and p.lid is not None else 0)


def to_ibnetdiscover(topo: Topology) -> str:
    """The topology as `ibnetdiscover` prints it: header, then all switches, then the rest."""
    ends = _ends(topo)
    out = ["#", f"# Topology file: generated with {topo.generated or 'fabricpool'}", "#"]
    if topo.initiated_from is not None:
        origin = topo.nodes.get(topo.initiated_from)
        first_port = next((p for n, p in sorted(origin.ports.items()) if n), None) if origin else None
        port_guid = first_port.guid if first_port and first_port.guid is not None else topo.initiated_from
        out.append(f"# Initiated from node {topo.initiated_from:016x} port {port_guid:016x}")
    ordered = sorted(topo.nodes.values(), key=lambda n: n.kind != SWITCH)  # stable: switches first
    for node in ordered:
        out.append("")
        if node.vendor_id is not None:
            out.append(f"vendid=0x{node.vendor_id:x}")
        if node.device_id is not None:
            out.append(f"devid=0x{node.device_id:x}")
        if node.system_image_guid:
            out.append(f"sysimgguid=0x{node.system_image_guid:x}")
        quoted = f'"{_LETTER[node.kind]}-{node.guid:016x}"'
        if node.kind == SWITCH:
            port0 = node.ports.get(0)
            out.append(f"switchguid=0x{node.guid:x}({(port0.guid if port0 and port0.guid is not None else node.guid):x})")
            port0_kind = "enhanced" if node.enhanced_port0 else "base"
            out.append(f'Switch\t{node.num_ports} {quoted}\t\t# "{node.description}" {port0_kind} port 0 lid {node.lid or 0} lmc {node.lmc or 0}')
        else:
            out.append(f"{'rtguid' if node.kind == ROUTER else 'caguid'}=0x{node.guid:x}")
            out.append(f'{"Rt" if node.kind == ROUTER else "Ca"}\t{node.num_ports} {quoted}\t\t# "{node.description}"')
        for port, far, link in ends[node.guid]:
            remote = topo.nodes.get(far[0])
            rkind = remote.kind if remote else link.b_kind
            rdesc = remote.description if remote else link.b_description
            rname = f'"{_LETTER.get(rkind, "H")}-{far[0]:016x}"[{far[1]}]'
            if rkind != SWITCH:
                rport = remote.ports.get(far[1]) if remote else None
                rname += f"({(rport.guid if rport and rport.guid is not None else far[0]):x}) "
            tail = f'"{rdesc}" lid {_port_lid(remote, far[1])} {_rate(link)}'
            if node.kind == SWITCH:
                out.append(f"[{port}]\t{rname}\t\t# {tail}")
            else:
                local = node.ports.get(port) or Port(port)
                out.append(f"[{port}]({(local.guid if local.guid is not None else node.guid):x}) \t{rname}\t\t# lid {local.lid or 0} lmc 0 {tail}")
    return "\n".join(out) + "\n"


def _ibsim_name(description: str) -> str:
    if '"' in description or not description.strip():
        raise ValueError(f"node description {description!r} cannot be an ibsim node name")
    return description


def to_ibsim_net(fattree: FatTree) -> str:
    """A net file for ibsim 0.10. Node names are the descriptions (ibsim reports them as the
    NodeDescription, so discovery through ibsim gives back the same names). Speed and width
    flags go on both ends of each cable: ibsim activates the highest value both ends enable."""
    topo = fattree.topology
    ends = _ends(topo)
    out = [
        "# ibsim net file written by fabricpool's fat-tree builder",
        f"# {fattree.describe()}",
    ]
    substituted = sorted({link.speed for link in topo.links if link.speed in IBSIM_MISSING_SPEEDS})
    for speed in substituted:
        out.append(f"# ibsim 0.10 has no {speed}: {speed} links are written as {IBSIM_MISSING_SPEEDS[speed]}")
    # The first port in the file is where the SM and the diags attach: a host, as on a real cluster.
    ordered = sorted(topo.nodes.values(), key=lambda n: n.kind == SWITCH)
    for node in ordered:
        out.append("")
        out.append(f'{"Switch" if node.kind == SWITCH else "Hca"}\t{node.num_ports}\t"{_ibsim_name(node.description)}"')
        for port, far, link in ends[node.guid]:
            remote = topo.nodes.get(far[0])
            if remote is None:
                continue  # a dangling cable has no far end to simulate
            speed = IBSIM_MISSING_SPEEDS.get(link.speed, link.speed) if link.speed else None
            flags = [IBSIM_SPEED_FLAGS[speed]] if speed in IBSIM_SPEED_FLAGS else []
            if link.width in IBSIM_WIDTH_FLAGS:
                flags.append(f"w={IBSIM_WIDTH_FLAGS[link.width]}")
            out.append(f'[{port}]\t"{_ibsim_name(remote.description)}"[{far[1]}]' + (f"\t{' '.join(flags)}" if flags else ""))
    return "\n".join(out) + "\n"


_NATURAL = re.compile(r"(\d+)")


def natural_key(text: str):
    """`mlx5_10` sorts after `mlx5_9`."""
    return [int(part) if part.isdigit() else part for part in _NATURAL.split(text)]
