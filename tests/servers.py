"""Servers for tests: an aiohttp app on a free localhost port from a background thread (the
agent simulator and small misbehaving agents), and daphne for the browser tests."""
import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent


class RunningServer:
    """An aiohttp app served on 127.0.0.1:<free port> from its own thread and event loop."""

    def __init__(self, app: web.Application):
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(app,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("test server did not start")
        self.base = f"http://127.0.0.1:{self.port}"

    def _run(self, app):
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=1024)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self._ready.set()
        self.loop.run_forever()

    def call(self, function, *args):
        """Run function(*args) on the server's loop (the app's state lives there)."""
        async def run():
            return function(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def running_daphne(tmp_path, env: dict):
    """The real ASGI server (daphne, config.asgi) on a free localhost port with `env`, for the
    browser tests; yields its base URL once /login/ answers and stops it afterwards. Its
    output goes to tmp_path/daphne.log, quoted when it does not start."""
    log_path = Path(tmp_path) / "daphne.log"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(log_path, "w") as log:  # daphne keeps its own descriptor
        daphne = subprocess.Popen([str(Path(sys.executable).with_name("daphne")), "-b", "127.0.0.1", "-p", str(port),
                                   "config.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/login/", timeout=2)  # nosec B310 - the test's own server
                break
            except OSError:
                if daphne.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("daphne did not start: " + log_path.read_text()[-2000:])
                time.sleep(0.2)
        yield base
    finally:
        daphne.terminate()
        try:
            daphne.wait(10)
        except subprocess.TimeoutExpired:
            daphne.kill()
