"""The agent's HTTP API (aiohttp). Endpoints, auth and limits: docs/agent-protocol.md.

Every request must carry `Authorization: Bearer <token>`; anything else gets 401 before
a handler runs, so a request without the token changes nothing. Errors are JSON
`{"error": ..., "path": ...}`; a bug in the agent is logged with its traceback here and
answered with a plain 500, never with the traceback.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from agent import hostinfo
from agent.launcher import Launcher, LaunchError
from agent.protocol import (
    MAX_REPORT_BYTES,
    MAX_REQUEST_BYTES,
    ProtocolError,
    parse_allocation_request,
    parse_report,
    token_matches,
)
from agent.report import Collector, GpuReadError

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """The agent cannot start: the message says what to fix."""


@dataclass
class AgentConfig:
    host_name: str
    token: str
    log_dir: Path
    sysfs_root: Path = Path("/sys")
    gpu_source: str = "auto"
    grace_s: float = 10.0
    collector: Collector | None = None  # injected by tests; built from the fields above otherwise


def load_token(path: str | os.PathLike) -> str:
    """The bearer token from its file: it must exist, be non-empty and not world-readable."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(f"token file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token file {path}: {exc}") from None
    if not token:
        raise ConfigError(f"token file {path} is empty")
    if mode & stat.S_IROTH:
        raise ConfigError(f"token file {path} is readable by every user; run: chmod 600 {path}")
    if any(c.isspace() for c in token):
        raise ConfigError(f"token file {path} holds more than one word; put only the token in it")
    return token


COLLECTOR = web.AppKey("collector", Collector)
LAUNCHER = web.AppKey("launcher", Launcher)
TOKEN = web.AppKey("token", str)


def error(status: int, message: str, path: str = "", headers: dict | None = None) -> web.Response:
    return web.json_response({"error": message, "path": path}, status=status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return error(413, f"request body over the {MAX_REQUEST_BYTES}-byte limit")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason, headers={k: v for k, v in exc.headers.items() if k == "Allow"})
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("error handling %s %s", request.method, request.path)
        return error(500, "internal error in the agent; see its log")


@web.middleware
async def auth_middleware(request: web.Request, handler):
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not token_matches(presented.strip(), request.app[TOKEN]):
        return error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="fabricpool-agent"'})
    return await handler(request)


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_REQUEST_BYTES, actual_size=request.content_length)
    return await request.read()  # aiohttp stops at client_max_size with 413 when unannounced


async def get_report(request: web.Request) -> web.Response:
    collector, launcher = request.app[COLLECTOR], request.app[LAUNCHER]
    allocations = launcher.report()
    try:
        report = await asyncio.to_thread(collector.build, allocations)
    except GpuReadError as exc:
        return error(503, f"cannot read the GPUs: {exc}")
    try:
        parse_report(report)
    except ProtocolError as exc:
        log.error("built an invalid report: %s", exc)
        return error(500, f"the agent built an invalid report: {exc.message}", exc.path)
    body = json.dumps(report, separators=(",", ":"))
    if len(body) > MAX_REPORT_BYTES:
        return error(500, f"report of {len(body)} bytes is over the {MAX_REPORT_BYTES}-byte limit")
    return web.Response(text=body, content_type="application/json")


async def post_allocation(request: web.Request) -> web.Response:
    body = await _body(request)
    try:
        allocation_request = parse_allocation_request(body)
    except ProtocolError as exc:
        return error(400, exc.message, exc.path)
    try:
        inventory = await asyncio.to_thread(request.app[COLLECTOR].gpus)
    except GpuReadError as exc:
        return error(503, f"cannot read the GPUs: {exc}")
    try:
        allocation, created = request.app[LAUNCHER].start(allocation_request, inventory)
    except LaunchError as exc:
        return error(exc.status, exc.message, exc.path)
    return web.json_response({"id": allocation.id, "state": allocation.state}, status=202 if created else 200)


async def delete_allocation(request: web.Request) -> web.Response:
    try:
        allocation = request.app[LAUNCHER].stop(request.match_info["id"])
    except LaunchError as exc:
        return error(exc.status, exc.message, exc.path)
    return web.json_response({"id": allocation.id, "state": allocation.state, "stop_requested": allocation.stop_requested}, status=202)


async def ack_allocation(request: web.Request) -> web.Response:
    await _body(request)  # ignored, but bounded like every body
    try:
        result = request.app[LAUNCHER].ack(request.match_info["id"])
    except LaunchError as exc:
        return error(exc.status, exc.message, exc.path)
    return web.json_response(result)


def make_app(config: AgentConfig) -> web.Application:
    if not config.token:
        raise ConfigError("the agent needs a bearer token")
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[errors_middleware, auth_middleware])
    app[TOKEN] = config.token
    app[COLLECTOR] = config.collector or Collector(
        config.host_name, sysfs_root=config.sysfs_root, gpu_source=config.gpu_source)
    app[LAUNCHER] = Launcher(config.log_dir, grace_s=config.grace_s)
    app.router.add_get("/v1/report", get_report)
    app.router.add_post("/v1/allocations", post_allocation)
    app.router.add_delete("/v1/allocations/{id}", delete_allocation)
    app.router.add_post("/v1/allocations/{id}/ack", ack_allocation)

    async def on_startup(app: web.Application) -> None:
        hostinfo.prime()
        await app[LAUNCHER].resume()

    async def on_cleanup(app: web.Application) -> None:
        await app[LAUNCHER].aclose()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
