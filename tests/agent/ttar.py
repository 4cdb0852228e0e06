"""Unpacks ttar, Prometheus' plain-text tar, so sysfs readers run on real fixture trees.

Records: `Directory: P` / `Path: P` + `Lines: N` + N lines of content / `SymlinkTo: T`,
each followed by `Mode: NNN` and separated by `# ttar - - -` lines. A content line that
ends in "EOF" is the file's last line, without its newline; "NULLBYTE" stands for a 0 byte.
"""
from __future__ import annotations

import os
from pathlib import Path


def extract(archive: str | os.PathLike, into: str | os.PathLike, *, strip: str = "") -> Path:
    """Materialise `archive` under `into`; paths lose the prefix `strip`. Returns `into`."""
    lines = Path(archive).read_text().split("\n")
    into = Path(into)
    i = 0

    def target(name: str) -> Path:
        name = name[len(strip):] if strip and name.startswith(strip) else name
        path = (into / name.lstrip("/")).resolve()
        if into.resolve() not in path.parents and path != into.resolve():
            raise ValueError(f"ttar path {name!r} escapes {into}")
        return path

    while i < len(lines):
        line = lines[i]
        if line.startswith("Directory: "):
            target(line[len("Directory: "):]).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = target(line[len("Path: "):])
            i += 1
            if lines[i].startswith("SymlinkTo: "):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(lines[i][len("SymlinkTo: "):])
            else:
                count = int(lines[i].removeprefix("Lines: "))
                content = lines[i + 1:i + 1 + count]
                i += count
                text = "".join(f"{c}\n" for c in content)
                if content and content[-1].endswith("EOF"):
                    text = text[: -len("EOF\n")]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(text.replace("NULLBYTE", "\0").encode())
        elif line.startswith("Mode: "):
            pass
        i += 1
    return into
