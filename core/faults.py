"""Fault-injection points for the reliability suite (tests/reliability).

`pause_point("cycle.persist")` does nothing unless the environment variable
FABRICPOOL_FAULT_PAUSE names that point (comma-separated names). Then it writes a marker file
<FABRICPOOL_FAULT_DIR>/<name> (so the test knows the process is exactly there, inside its
transaction) and sleeps FABRICPOOL_FAULT_SLEEP_S (default 120) seconds, giving the test time
to SIGKILL the process at that point. Production never sets the variable: the cost is one
dictionary lookup.
"""
from __future__ import annotations

import os
import time
from pathlib import Path


def pause_point(name: str) -> None:
    wanted = os.environ.get("FABRICPOOL_FAULT_PAUSE")
    if not wanted or name not in wanted.split(","):
        return
    directory = Path(os.environ.get("FABRICPOOL_FAULT_DIR", "."))
    (directory / name).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("FABRICPOOL_FAULT_SLEEP_S", "120")))
