"""Readers for the job traces the replay understands (pure Python, no Django).

  * Microsoft ITP (ElasticFlow): `job_id,submission_time,duration,num_gpu`.
  * Alibaba openb pod list (FGD): `name,cpu_milli,memory_mib,num_gpu,gpu_milli,...,qos,
    ...,creation_time,deletion_time,scheduled_time`, with its node list
    `sn,cpu_milli,memory_mib,gpu,model`.

Every reader reads the whole file before returning anything: a malformed row raises
TraceError naming file:line, so nothing of a bad trace is ever replayed.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "creation_time")
OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
MAX_ROWS = 1_000_000


class TraceError(ValueError):
    """The trace cannot be replayed; the message names the file (and line) and why."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float
    duration: float
    gpus: int
    milli: int = 0  # a fraction of one GPU (openb), 0: whole GPUs
    qos: str = ""


@dataclass(frozen=True, slots=True)
class Pod:
    id: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    milli: int  # per GPU; 1000 for whole GPUs
    qos: str
    created: float


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def kind(path: Path | str) -> str:
    """'itp', 'openb' (pod list) or 'openb-nodes', from the header; TraceError otherwise."""
    header = _header(Path(path))
    if set(ITP_COLUMNS) <= set(header):
        return "itp"
    if set(OPENB_POD_COLUMNS) <= set(header):
        return "openb"
    if set(OPENB_NODE_COLUMNS) <= set(header):
        return "openb-nodes"
    raise TraceError(f"{path}:1: unknown trace format: expected the columns {','.join(ITP_COLUMNS)} (Microsoft "
                     f"ITP) or {','.join(OPENB_POD_COLUMNS)} (Alibaba openb pod list)")


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read it ({exc})") from None


def _rows(path: Path, columns: tuple):
    try:
        f = open(path, newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}:1: {exc}") from None
        if not header:
            raise TraceError(f"{path}: empty file")
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        where = {c: header.index(c) for c in header}
        try:
            for row in reader:
                if reader.line_num > MAX_ROWS:
                    raise TraceError(f"{path}: more than {MAX_ROWS} rows")
                if not row:
                    continue
                if len(row) != len(header):
                    raise TraceError(f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}")
                yield reader.line_num, {c: row[i] for c, i in where.items()}
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}:{reader.line_num}: {exc}") from None


def _number(path, line, row, column, *, integer=False, minimum=0.0):
    text = row[column].strip()
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind_ = "a whole number" if integer else "a number"
        raise TraceError(f"{path}:{line}: {column} must be {kind_}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value < minimum:
        raise TraceError(f"{path}:{line}: {column} must be at least {minimum:g}, got {text!r}")
    return value


def read_itp(path: Path | str) -> list[TraceJob]:
    """Jobs in submission order. Every row is checked before any is returned."""
    path = Path(path)
    jobs = []
    for line, row in _rows(path, ITP_COLUMNS):
        jobs.append(TraceJob(
            id=row["job_id"].strip() or f"line{line}",
            submit=_number(path, line, row, "submission_time"),
            duration=_number(path, line, row, "duration"),
            gpus=_number(path, line, row, "num_gpu", integer=True, minimum=1),
        ))
    if not jobs:
        raise TraceError(f"{path}: no jobs")
    jobs.sort(key=lambda j: j.submit)
    return jobs


def read_openb_pods(path: Path | str) -> list[Pod]:
    """Pods in creation order (the order FGD's replay feeds them)."""
    path = Path(path)
    pods = []
    for line, row in _rows(path, OPENB_POD_COLUMNS):
        gpus = _number(path, line, row, "num_gpu", integer=True)
        milli = _number(path, line, row, "gpu_milli", integer=True)
        if gpus and not 1 <= milli <= 1000:
            raise TraceError(f"{path}:{line}: gpu_milli must be 1-1000 for a pod with GPUs, got {milli}")
        if gpus > 1 and milli != 1000:
            raise TraceError(f"{path}:{line}: a pod with {gpus} GPUs must take them whole (gpu_milli 1000), "
                             f"got {milli}")
        pods.append(Pod(id=row["name"].strip() or f"line{line}",
                        cpu_milli=_number(path, line, row, "cpu_milli", integer=True),
                        memory_mib=_number(path, line, row, "memory_mib", integer=True),
                        gpus=gpus, milli=milli if gpus else 0, qos=row["qos"].strip(),
                        created=_number(path, line, row, "creation_time")))
    if not pods:
        raise TraceError(f"{path}: no pods")
    pods.sort(key=lambda p: p.created)
    return pods


def read_openb_nodes(path: Path | str) -> list[Node]:
    path = Path(path)
    nodes = []
    for line, row in _rows(path, OPENB_NODE_COLUMNS):
        nodes.append(Node(id=row["sn"].strip() or f"line{line}",
                          cpu_milli=_number(path, line, row, "cpu_milli", integer=True),
                          memory_mib=_number(path, line, row, "memory_mib", integer=True),
                          gpus=_number(path, line, row, "gpu", integer=True),
                          model=row["model"].strip()))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes
