"""Run a simulated InfiniBand fabric with the real tools: `ibsim` serves a net file, the
real `opensm` sweeps it once, and the real infiniband-diags (`ibnetdiscover`, `perfquery`,
`iblinkinfo`, ...) run through `ibsim-run`. Used by the tests, the demo and planners who
want to try discovery without hardware. No Django here.

    with SimulatedFabric(net_text) as sim:
        topo_text = sim.run("ibnetdiscover")
        sim.console('Unlink "leaf01"[5]')
        sim.sweep()
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

TOOLS = ("ibsim", "ibsim-run", "opensm", "ibnetdiscover")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class SimulatorError(RuntimeError):
    pass


class SimulatedFabric:
    def __init__(self, net_text: str, max_switches: int = 1024, max_nodes: int = 8192, max_ports: int = 65536):
        self.net_text = net_text
        self.limits = ["-S", str(max_switches), "-N", str(max_nodes), "-P", str(max_ports)]
        self.name = f"fp{uuid.uuid4().hex[:10]}"  # one socket name per instance
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._console = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def env(self) -> dict:
        return {**os.environ, "IBSIM_SOCKNAME": self.name}

    def start(self, sweep: bool = True):
        if missing := missing_tools():
            raise SimulatorError(f"missing tools: {', '.join(missing)} (Debian: ibsim-utils infiniband-diags opensm)")
        self.dir = Path(tempfile.mkdtemp(prefix="ibsim-"))
        net = self.dir / "net"
        net.write_text(self.net_text)
        log = open(self.dir / "ibsim.log", "wb")
        # The console (a pipe we hold) must stay open: at EOF ibsim busy-loops on stdin.
        self.proc = subprocess.Popen(
            ["ibsim", "-s", *self.limits, str(net)], stdin=subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )
        log.close()
        self._console = self.proc.stdin
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SimulatorError(f"ibsim exited: {self.log_tail()}")
            if self._ready():
                break
            time.sleep(0.1)
        if sweep:
            self.sweep()

    def _ready(self) -> bool:
        text = (self.dir / "ibsim.log").read_bytes()
        return b"simulator ready" in text

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.console("quit")
            except (OSError, SimulatorError):
                pass
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=3)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = None

    def log_tail(self, lines: int = 20) -> str:
        if not self.dir:
            return ""
        text = (self.dir / "ibsim.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- use ---------------------------------------------------------------------------------
    def console(self, command: str):
        """Send one console command (Unlink, ReLink, PerformanceSet, Error, ...)."""
        if len(command) >= 128:
            raise SimulatorError("ibsim console lines are limited to 127 characters")
        if not self.proc or self.proc.poll() is not None:
            raise SimulatorError("ibsim is not running")
        self._console.write(command.encode() + b"\n")
        self._console.flush()
        time.sleep(0.2)  # the console is asynchronous; give it a moment to apply

    def sweep(self, timeout: float = 120):
        """One OpenSM sweep (assigns LIDs, brings ports to Active), then OpenSM exits."""
        env = {**self.env, "OSM_CACHE_DIR": str(self.dir), "OSM_TMP_DIR": str(self.dir)}
        result = subprocess.run(
            ["ibsim-run", "opensm", "-o", "-f", str(self.dir / "opensm.log")],
            env=env, capture_output=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise SimulatorError(f"opensm failed ({result.returncode}): {result.stderr.decode(errors='replace')[-500:]}")

    def command(self, *argv: str) -> list[str]:
        """The argv that runs a diag tool against this simulator (for IB_DISCOVER_COMMAND etc.)."""
        return ["env", f"IBSIM_SOCKNAME={self.name}", "ibsim-run", *argv]

    def run(self, *argv: str, timeout: float = 120) -> str:
        result = subprocess.run(["ibsim-run", *argv], env=self.env, capture_output=True, timeout=timeout)
        if result.returncode != 0:
            raise SimulatorError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.decode(errors='replace')[-500:]}")
        return result.stdout.decode()
