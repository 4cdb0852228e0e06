"""An aiohttp app served on a free localhost port from a background thread: the agent
simulator and small misbehaving agents in the pool and scheduler tests."""
import asyncio
import threading

from aiohttp import web


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
