"""Fetch many agents' reports at once (asyncio + aiohttp). Pure of Django: it takes plain
targets and returns one Result per target, a validated report or the reason there is none.

Limits, all enforced here, so that no agent can stall or swamp a poll round:
* connect timeout and read timeout (no bytes for that long) per request, plus a total time
  per request (a slow-loris agent trickling a byte a second never trips the read timeout),
  plus an optional deadline for the whole batch;
* at most `concurrency` requests in flight (a semaphore taken before the clock starts, so
  waiting for a free slot never counts against an agent);
* a body-size cap, checked while reading (decompressed bytes, so a gzip bomb stops early).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from agent.protocol import MAX_REPORT_BYTES, ProtocolError, parse_report

from . import prometheus

USER_AGENT = "fabricpool-poller/1"
MAX_ERROR_BODY = 4096  # what is read of a non-200 answer, to quote its "error"

# Result.error values
TIMEOUT = "timeout"
REFUSED = "refused"
UNREACHABLE = "unreachable"
DISCONNECTED = "disconnected"
HTTP = "http"
OVERSIZED = "oversized"
INVALID = "invalid"
WRONG_HOST = "wrong_host"
BAD_URL = "bad_url"
ERROR = "error"

KIND_AGENT = "fabricpool"
KIND_DCGM = "dcgm"
KIND_NODE_EXPORTER = "node_exporter"


@dataclass(frozen=True)
class Target:
    host_id: int
    name: str
    url: str  # the agent's base URL, or an exporter's metrics URL
    token: str = ""
    kind: str = KIND_AGENT
    ib_url: str = ""  # dcgm hosts: a node_exporter metrics URL for the IB ports


@dataclass
class Result:
    host_id: int
    name: str
    report: dict | None = None
    error: str = ""
    message: str = ""
    seconds: float = 0.0
    received_at: float = 0.0  # unix time the report arrived (or the attempt ended)

    @property
    def ok(self) -> bool:
        return self.report is not None

    @property
    def reason(self) -> str:
        return f"{self.error}: {self.message}" if self.error else ""


@dataclass(frozen=True)
class Limits:
    connect_timeout: float = 1.0
    read_timeout: float = 3.0
    total_timeout: float | None = None  # per request; default connect + read + 1
    concurrency: int = 256
    max_bytes: int = MAX_REPORT_BYTES

    @property
    def request_timeout(self) -> float:
        return self.total_timeout or self.connect_timeout + self.read_timeout + 1.0


class FetchError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def report_url(target: Target) -> str:
    if target.kind == KIND_AGENT:
        return target.url.rstrip("/") + "/v1/report"
    return target.url


async def fetch_all(targets: list[Target], limits: Limits = Limits(), *, deadline: float | None = None) -> list[Result]:
    """One Result per target, in the targets' order. `deadline`: seconds for the whole
    batch; requests still running then end as timeouts."""
    if not targets:
        return []
    # aiohttp's own total is a safety net just above ours (asyncio.timeout in _fetch_one, which
    # also covers validation and gives the clearer message).
    timeout = aiohttp.ClientTimeout(total=limits.request_timeout + 0.5, sock_connect=limits.connect_timeout,
                                    sock_read=limits.read_timeout)
    connector = aiohttp.TCPConnector(limit=limits.concurrency, ttl_dns_cache=300)
    slots = asyncio.Semaphore(limits.concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers={"User-Agent": USER_AGENT}) as session:
        tasks = [asyncio.ensure_future(_fetch_one(session, slots, target, limits)) for target in targets]
        done, pending = await asyncio.wait(tasks, timeout=deadline)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    results = []
    now = time.time()
    for target, task in zip(targets, tasks, strict=True):
        if task in done and not task.cancelled() and task.exception() is None:
            results.append(task.result())
            continue
        if task in done and not task.cancelled():  # a bug of ours: that host's error, not the round's
            exc = task.exception()
            kind, message = ERROR, f"poller error: {type(exc).__name__}: {exc}"[:500]
        else:
            kind, message = TIMEOUT, f"no report before the round's {deadline:g} s deadline"
        results.append(Result(target.host_id, target.name, error=kind, message=message, received_at=now))
    return results


def fetch_sync(targets: list[Target], limits: Limits = Limits(), *, deadline: float | None = None) -> list[Result]:
    """fetch_all from synchronous code (a Celery task, a benchmark)."""
    return asyncio.run(fetch_all(targets, limits, deadline=deadline))


async def _fetch_one(session, slots, target: Target, limits: Limits) -> Result:
    async with slots:
        started = time.monotonic()
        result = Result(target.host_id, target.name)
        try:
            async with asyncio.timeout(limits.request_timeout):
                result.report = await _report(session, target, limits)
        except FetchError as exc:
            result.error, result.message = exc.kind, exc.message
        except aiohttp.ClientError as exc:  # before TimeoutError: aiohttp's timeouts are both
            result.error, result.message = _client_error(exc, limits)
        except TimeoutError:
            result.error, result.message = TIMEOUT, _timeout_message(None, limits)
        result.seconds = time.monotonic() - started
        result.received_at = time.time()
        return result


async def _report(session, target: Target, limits: Limits) -> dict:
    if target.kind == KIND_AGENT:
        body = await _get(session, report_url(target), limits, token=target.token)
        try:
            report = parse_report(body, max_bytes=limits.max_bytes)
        except ProtocolError as exc:
            raise FetchError(INVALID, f"{exc.path or 'report'}: {exc.message}"[:500]) from None
        if report["host"] != target.name:
            raise FetchError(WRONG_HOST, f"the report is from host {report['host'][:100]!r}, not {target.name!r}")
        return _unique_indexes(report)
    if target.kind not in (KIND_DCGM, KIND_NODE_EXPORTER):
        raise FetchError(ERROR, f"unknown agent kind {target.kind!r}")
    dcgm_text = node_text = None
    if target.kind == KIND_DCGM:
        dcgm_text = _text(await _get(session, target.url, limits))
        if target.ib_url:
            node_text = _text(await _get(session, target.ib_url, limits))
    else:
        node_text = _text(await _get(session, target.url, limits))
    try:
        raw = prometheus.report_from_exporters(target.name, dcgm_text=dcgm_text, node_text=node_text, now=time.time())
        return _unique_indexes(parse_report(raw, max_bytes=limits.max_bytes))
    except prometheus.ExporterError as exc:
        raise FetchError(INVALID, str(exc)[:500]) from None
    except ProtocolError as exc:
        raise FetchError(INVALID, f"exporter data does not fit the report: {exc.path}: {exc.message}"[:500]) from None


def _unique_indexes(report: dict) -> dict:
    """The pool keys a host's GPUs by index as well as UUID: two GPUs with one index are refused."""
    seen = set()
    for i, gpu in enumerate(report["gpus"]):
        if gpu["index"] in seen:
            raise FetchError(INVALID, f"gpus[{i}].index: duplicate GPU index {gpu['index']}")
        seen.add(gpu["index"])
    return report


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FetchError(INVALID, f"metrics page is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


async def _get(session, url: str, limits: Limits, *, token: str = "") -> bytes:
    headers = {"Accept": "application/json, text/plain"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        request = session.get(url, headers=headers, allow_redirects=False)
    except (ValueError, aiohttp.InvalidURL) as exc:
        raise FetchError(BAD_URL, f"cannot fetch {url!r}: {exc}") from None
    try:
        async with request as response:
            if response.status != 200:
                raise FetchError(HTTP, await _http_error(response))
            length = response.content_length
            if length is not None and length > limits.max_bytes and not response.headers.get("Content-Encoding"):
                raise FetchError(OVERSIZED, f"body of {length} bytes is over the {limits.max_bytes}-byte limit; not read")
            return await _read_limited(response, limits.max_bytes)
    except aiohttp.InvalidURL as exc:
        raise FetchError(BAD_URL, f"cannot fetch {url!r}: {exc}") from None


async def _read_limited(response, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        part = await response.content.readany()
        if not part:
            return b"".join(parts)
        size += len(part)
        if size > limit:
            raise FetchError(OVERSIZED, f"body over the {limit}-byte limit; stopped reading")
        parts.append(part)


async def _http_error(response) -> str:
    """`HTTP 401: wrong or missing token`: the agent's JSON "error" when it sent one."""
    detail = ""
    try:
        raw = await response.content.read(MAX_ERROR_BODY)
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            detail = data["error"][:300]
    except (ValueError, UnicodeDecodeError, aiohttp.ClientError, TimeoutError):
        pass
    head = f"HTTP {response.status}" + (f" {response.reason}" if response.reason else "")
    if response.status == 401 and not detail:
        detail = "the agent refused the token"
    return f"{head}: {detail}" if detail else head


def _timeout_message(exc, limits: Limits) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"no connection within {limits.connect_timeout:g} s"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return f"no data for {limits.read_timeout:g} s"
    return f"no complete report within {limits.request_timeout:g} s"


def _client_error(exc: aiohttp.ClientError, limits: Limits) -> tuple[str, str]:
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return TIMEOUT, _timeout_message(exc, limits)
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return REFUSED, f"connection refused by {exc.host}:{exc.port}"
        return UNREACHABLE, f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return DISCONNECTED, "the agent closed the connection without an answer"
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return DISCONNECTED, f"the connection broke while reading: {exc}"[:300]
    if isinstance(exc, aiohttp.ClientResponseError):
        return HTTP, f"not a valid HTTP answer: {exc.message}"[:300]
    return ERROR, f"{type(exc).__name__}: {exc}"[:300]
