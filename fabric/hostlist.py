"""Slurm hostlist expressions: ["gpu001", "gpu002", "gpu004"] -> "gpu[001-002,004]"."""
from __future__ import annotations

import re
from collections import defaultdict

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress(names) -> str:
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    plain = []
    for name in sorted(set(names)):
        m = _NUMBERED.match(name)
        if m and "[" not in name and "," not in name:
            digits = m[2]
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0  # 0: not zero-padded
            groups[m[1], width].append(int(digits))
        else:
            plain.append(name)
    parts = []
    for (prefix, width), numbers in sorted(groups.items()):
        numbers.sort()
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges, start, prev = [], numbers[0], numbers[0]
        for n in numbers[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts + plain)


def expand(expression: str) -> list[str]:
    """The inverse, for tests and for reading Slurm files: "gpu[01-03],x" -> [...]."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expression):
        m = re.match(r"^(.*?)\[([^\]]*)\](.*)$", part)
        if not m:
            names.append(part)
            continue
        prefix, body, suffix = m.groups()
        for item in body.split(","):
            lo, _, hi = item.partition("-")
            width = len(lo) if lo.startswith("0") else 0
            for n in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return names
