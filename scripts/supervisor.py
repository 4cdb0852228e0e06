"""A small foreground process supervisor (standard library only), in the spirit of foreman
and honcho: start several long-running programs, prefix each output line with the
program's name, stop them all on one Ctrl-C, and stop them all when any one of them dies
(a program marked `restart` is started again instead, within limits).

Each child runs in its own session (process group). The terminal's Ctrl-C therefore
reaches only the supervisor, which asks each program to stop (SIGTERM by default), waits,
and at last kills whole process groups, so that nothing a program started outlives it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Program:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the supervisor's environment
    # How to ask for a clean stop, whether the supervisor got SIGINT or SIGTERM: Celery
    # treats SIGTERM as its warm shutdown (SIGINT makes the worker exit with code 1).
    stop_signal: int = signal.SIGTERM
    # Started again when it exits on its own, as systemd's Restart=on-failure would, unless
    # it exits RESTART_LIMIT times within RESTART_WINDOW_S: then everything stops. For the
    # Celery worker: kombu's Redis transport can die with "Unrecoverable error" when Redis
    # goes away while messages are unacknowledged (found by bench.soak).
    restart: bool = False


RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was stopped by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class Supervisor:
    def __init__(self, programs: list[Program], *, cwd=None, env=None, grace: float = 15.0, out=None):
        self.programs = programs
        self.cwd = cwd
        self.env = dict(os.environ if env is None else env)
        self.grace = grace
        self.out = out or sys.stdout
        self.width = max(len("supervisor"), *(len(p.name) for p in programs))
        self.lock = threading.Lock()
        self.running: list[tuple[Program, subprocess.Popen]] = []
        self.readers: list[threading.Thread] = []
        self.signals: list[int] = []
        self.restarts: dict[str, list[float]] = {}

    def say(self, name: str, text: str) -> None:
        with self.lock:
            self.out.write(f"{name:<{self.width}} | {text}\n")
            self.out.flush()

    def _pump(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.say(name, raw.decode("utf-8", "replace").rstrip("\r\n"))
        stream.close()

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    def _start(self, program: Program) -> None:
        proc = subprocess.Popen(
            program.argv,
            cwd=self.cwd,
            env=self.env | program.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running.append((program, proc))
        reader = threading.Thread(target=self._pump, args=(program.name, proc.stdout), daemon=True)
        reader.start()
        self.readers.append(reader)
        self.say(program.name, f"started (pid {proc.pid}): {' '.join(program.argv)}")

    def _ask_to_stop(self) -> None:
        # The program alone, not its group: Celery's main process stops its pool itself
        # (pool processes that get SIGTERM during start-up make the worker fail).
        for program, proc in self.running:
            if proc.poll() is None:
                proc.send_signal(program.stop_signal)

    def _kill_groups(self) -> None:
        # Whole groups, even where the program itself has exited: its children may remain.
        for _, proc in self.running:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop_all(self) -> None:
        """Ask every program to stop, wait up to `grace` seconds, then kill what is left.
        A second Ctrl-C while waiting kills at once."""
        self._ask_to_stop()
        seen = len(self.signals)
        deadline = time.monotonic() + self.grace
        while any(proc.poll() is None for _, proc in self.running):
            if time.monotonic() > deadline or len(self.signals) > seen:
                for program, proc in self.running:
                    if proc.poll() is None:
                        self.say("supervisor", f"{program.name} did not stop; killing it")
                self._kill_groups()
                break
            time.sleep(0.1)
        for _, proc in self.running:
            proc.wait()
        self._kill_groups()  # stragglers left behind by a program that exited
        for reader in self.readers:
            reader.join(timeout=2)
        for program, proc in self.running:
            self.say("supervisor", f"{program.name} {how_it_ended(proc.returncode)}")

    def _restart(self, program: Program, proc: subprocess.Popen, why: str) -> bool:
        """Start a restartable program that exited again; False when it may not be."""
        if not program.restart:
            return False
        now = time.monotonic()
        recent = [t for t in self.restarts.get(program.name, []) if now - t < RESTART_WINDOW_S]
        if len(recent) >= RESTART_LIMIT:
            self.say("supervisor", f"{program.name} exited {RESTART_LIMIT + 1} times within "
                                   f"{RESTART_WINDOW_S:g} s; not restarting it")
            return False
        self.restarts[program.name] = recent + [now]
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind
        except (ProcessLookupError, PermissionError):
            pass
        self.running.remove((program, proc))
        self.say("supervisor", f"{why}; starting it again ({len(recent) + 1} of {RESTART_LIMIT} "
                               f"restarts allowed per {RESTART_WINDOW_S:g} s)")
        time.sleep(min(2 ** len(recent) * 0.5, 8))
        try:
            self._start(program)
        except OSError as exc:
            self.say("supervisor", f"cannot start {program.name} again: {exc}")
            return False
        return True

    def run(self) -> int:
        """Run until a signal (exit 0) or until a program exits on its own (exit 1)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        reason = None
        try:
            for program in self.programs:
                try:
                    self._start(program)
                except OSError as exc:
                    reason = f"cannot start {program.name}: {exc}"
                    break
            while reason is None and not self.signals:
                for program, proc in self.running:
                    if proc.poll() is not None:
                        reason = f"{program.name} {how_it_ended(proc.returncode)}"
                        if self._restart(program, proc, reason):
                            reason = None
                        break
                else:
                    time.sleep(0.2)
            if reason:
                self.say("supervisor", f"{reason}; stopping the others")
                self._stop_all()
                self.say("supervisor", f"failed: {reason}")
                return 1
            self.say("supervisor", f"got {signal.Signals(self.signals[0]).name}; stopping all")
            self._stop_all()
            return 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
