"""Agents that hang, answer garbage, answer 50 MB, answer one byte a second, or vanish: a poll
round run by a real worker still ends within its time budget, only those hosts are marked,
and the worker's memory stays bounded."""
import asyncio

import pytest
from aiohttp import web

from bench.stack import dump, free_port, wait_for
from tests.servers import RunningServer

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


def hostile_app() -> web.Application:
    async def hang(request):
        await asyncio.sleep(3600)
        return web.Response()

    async def garbage(request):
        return web.Response(body=b"\x00\xffnot json at all{{{", content_type="application/json")

    async def huge(request):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b" " * (1 << 20)
        for _ in range(50):
            await response.write(chunk)
        await response.write_eof()
        return response

    async def trickle(request):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for byte in b'{"schema": 1, "host": "slow"' * 10:
            await response.write(bytes([byte]))
            await asyncio.sleep(1)
        return response

    app = web.Application()
    app.router.add_get("/hang/v1/report", hang)
    app.router.add_get("/garbage/v1/report", garbage)
    app.router.add_get("/huge/v1/report", huge)
    app.router.add_get("/trickle/v1/report", trickle)
    return app


def test_bad_agents_do_not_hold_up_the_round_and_only_their_hosts_are_marked(stack):
    server = RunningServer(hostile_app())
    try:
        hosts = [r[0] for r in stack.sql("SELECT name FROM pool_host ORDER BY name")]
        bad = {hosts[0]: f"{server.base}/hang", hosts[1]: f"{server.base}/garbage", hosts[2]: f"{server.base}/huge",
               hosts[3]: f"{server.base}/trickle", hosts[4]: f"http://127.0.0.1:{free_port()}/gone"}
        for name, url in bad.items():
            stack.sql("UPDATE pool_host SET agent_url = %s WHERE name = %s", (url, name))
        stack.start_worker(concurrency=1)
        stack.start_beat()
        rss_start = None
        rounds = wait_for(lambda: stack.sql(
            "SELECT id, duration_s, hosts_ok, hosts_error FROM pool_pollround WHERE finished_at IS NOT NULL "
            "ORDER BY id"), 60, "a finished poll round")
        rss_start = stack.rss_mib("worker")
        wait_for(lambda: len(stack.sql("SELECT id FROM pool_pollround WHERE finished_at IS NOT NULL")) >= 5, 90,
                 "five finished poll rounds")
        rounds = stack.sql("SELECT id, duration_s, hosts_ok, hosts_error FROM pool_pollround "
                           "WHERE finished_at IS NOT NULL ORDER BY id")
        # Budget: each chunk gives up at max(0.8 x POLL_INTERVAL, the per-request timeout);
        # connect 1 s + read 2 s here, so a round may take about 3 s plus writing.
        assert all(duration <= 8 for _, duration, _, _ in rounds), rounds
        assert all((ok, err) == (len(hosts) - 5, 5) for _, _, ok, err in rounds[1:]), rounds
        states = dict(stack.sql("SELECT name, state FROM pool_host"))
        assert all(states[h] == "up" for h in hosts if h not in bad), states
        errors = dict(stack.sql("SELECT name, last_error FROM pool_host WHERE name = ANY(%s)", (list(bad),)))
        assert all(errors[h] for h in bad), errors
        rss_end = stack.rss_mib("worker")
        assert rss_end - rss_start < 150, f"worker grew from {rss_start:.0f} to {rss_end:.0f} MiB"
        assert stack.violations() == [], dump(stack)
        print(f"rounds {[round(d, 2) for _, d, _, _ in rounds]} s; worker {rss_start:.0f} -> {rss_end:.0f} MiB")
    finally:
        server.stop()
