"""`python -m agent simulate`: a whole virtual cluster in one process, on one port.

Every host gets a virtual agent at `http://BIND:PORT/h/{host}` that speaks exactly the agent
protocol (agent/protocol.py, docs/agent-protocol.md), tokens included:

    GET    /h/{host}/v1/report
    POST   /h/{host}/v1/allocations
    DELETE /h/{host}/v1/allocations/{id}
    POST   /h/{host}/v1/allocations/{id}/ack

How the hosts behave is agent/workload.py. Faults are injected through a control endpoint
that takes the control token (from --control-token-file, else derive_token(secret, "simulator control")):

    GET  /control/faults                 what is injected now
    POST /control/faults                 {"host": "gpu0001" | "*" | [...], "fault": F, "params": {...}}
    GET  /control/hosts                  every host with its agent URL
    GET  /healthz                        no token: {"ok": true, "hosts": N}

Faults (several may be set on one host; "clear" removes all of them):
    down       the host's requests get their connection closed without a response
    slow       respond after params.delay_s (default 2)
    hang       never respond (until cleared, the client gives up, or params.max_s = 3600 pass)
    trickle    a valid report, one byte every params.interval_s (default 1): a slow loris
    garbage    200 with a body the poller must refuse; params.body: truncated (default),
               binary, html, not_object, wrong_schema, invalid_field
    oversized  200 with a valid JSON report padded to params.mb MB (default 50), streamed;
               params.content_length: true announces its length up front
    ecc        GPU params.gpu (default 0) gains params.count (default 1) uncorrected and
               params.corrected (default 0) corrected ECC errors
    flap_ib    IB port params.port (index or device, default 0) goes DOWN at once and toggles
               every params.period_s (default 5)
down, slow, hang apply to every path of the host; the others to its report.

No Django at import time: --fabric imports it only to read the hosts of a fabric.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from .protocol import (
    MAX_REQUEST_BYTES,
    ProtocolError,
    derive_token,
    parse_allocation_request,
    token_matches,
)
from .workload import (
    AllocationError,
    GpuSpec,
    HcaSpec,
    HostSpec,
    SimHost,
    agent_guid,
    default_hca_guid,
    gpu_profile,
    synthetic_gpu_uuid,
)

DEFAULT_PORT = 9500
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DURATION_S = 60.0
CONTROL_TOKEN_NAME = "simulator control"  # a space: no host can be named so
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # safe in a URL path segment
FAULTS = ("down", "slow", "hang", "trickle", "garbage", "oversized", "ecc", "flap_ib", "clear")
GARBAGE_BODIES = ("truncated", "binary", "html", "not_object", "wrong_schema", "invalid_field")
MAX_CONTROL_BYTES = 1024 * 1024
_PADDING = b"x" * 65536


# -- hosts ----------------------------------------------------------------------------------

class HostsError(ValueError):
    """A hosts file or fabric that cannot be simulated; the message says where and why."""


def load_hosts_file(path: str | os.PathLike, *, gpus_per_host: int = 8, gpu_model: str = DEFAULT_GPU_MODEL,
                    gpu_memory_mib: int | None = None, ib_rate_gbps: float = 400.0) -> list[HostSpec]:
    """A JSON list of hosts (`[{"name": "gpu0001", "gpus": 8, "hcas": ["mlx5_0"]}, ...]`, or
    plain names) or a text file with one host name per line (`#` comments)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HostsError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HostsError(f"{path}: not a text file (not UTF-8)") from None
    return parse_hosts(text, source=str(path), gpus_per_host=gpus_per_host, gpu_model=gpu_model,
                       gpu_memory_mib=gpu_memory_mib, ib_rate_gbps=ib_rate_gbps)


def parse_hosts(text: str, *, source: str = "hosts", gpus_per_host: int = 8, gpu_model: str = DEFAULT_GPU_MODEL,
                gpu_memory_mib: int | None = None, ib_rate_gbps: float = 400.0) -> list[HostSpec]:
    defaults = {"gpus": gpus_per_host, "model": gpu_model, "memory": gpu_memory_mib, "rate": ib_rate_gbps}
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise HostsError(f"{source}: not valid JSON: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("hosts"), list):
            data = data["hosts"]
        if not isinstance(data, list):
            raise HostsError(f"{source}: expected a JSON list of hosts")
        entries = [(f"{source}: hosts[{i}]", item) for i, item in enumerate(data)]
    else:
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                entries.append((f"{source}, line {number}", line))
    hosts, seen = [], {}
    for where, item in entries:
        spec = _host_entry(item, where, defaults)
        if spec.name in seen:
            raise HostsError(f"{where}: host {spec.name!r} is already listed at {seen[spec.name]}")
        seen[spec.name] = where
        hosts.append(spec)
    if not hosts:
        raise HostsError(f"{source}: no hosts in it")
    return hosts


def _host_entry(item, where: str, defaults: dict) -> HostSpec:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict):
        raise HostsError(f"{where}: expected a host name or an object, got {type(item).__name__}")
    name = item.get("name")
    if not isinstance(name, str) or not HOST_NAME.match(name):
        raise HostsError(f"{where}: name {name!r} is not a host name (letters, digits, '.', '_', '-'; at most 200)")
    known = {"name", "gpus", "hcas", "gpu_model", "memory_mib", "cpus", "host_memory_mib"}
    unknown = sorted(set(item) - known)
    if unknown:
        raise HostsError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    model = item.get("gpu_model", defaults["model"])
    if not isinstance(model, str) or not 0 < len(model) <= 80:
        raise HostsError(f"{where}.gpu_model: expected a model name of 1 to 80 characters")
    memory = _whole(item.get("memory_mib", defaults["memory"] or gpu_profile(model).memory_mib), f"{where}.memory_mib", 1)

    hcas_in = item.get("hcas", ["mlx5_0"])
    if not isinstance(hcas_in, list) or len(hcas_in) > 64:
        raise HostsError(f"{where}.hcas: expected a list of at most 64 HCA device names")
    hcas = []
    for i, hca in enumerate(hcas_in):
        hcas.append(_hca_entry(name, hca, f"{where}.hcas[{i}]", defaults["rate"]))
    if len({h.device for h in hcas}) != len(hcas):
        raise HostsError(f"{where}.hcas: a device is listed twice")
    devices = [h.device for h in hcas]

    gpus_in = item.get("gpus", defaults["gpus"])
    if isinstance(gpus_in, list):
        if len(gpus_in) > 64:
            raise HostsError(f"{where}.gpus: more than 64 GPUs")
        gpus = tuple(_gpu_entry(name, g, i, f"{where}.gpus[{i}]", model, memory, devices) for i, g in enumerate(gpus_in))
        if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
            raise HostsError(f"{where}.gpus: GPU indexes and UUIDs must be unique")
    else:
        count = _whole(gpus_in, f"{where}.gpus", 0, 64)
        gpus = tuple(
            GpuSpec(i, synthetic_gpu_uuid(name, i), model, memory, devices[i % len(devices)] if devices else "")
            for i in range(count)
        )
    cpus = _whole(item.get("cpus", 112), f"{where}.cpus", 1, 4096)
    host_memory = _whole(item.get("host_memory_mib", 2_063_731), f"{where}.host_memory_mib", 1)
    return HostSpec(name, gpus, tuple(hcas), cpu_count=cpus, memory_mib=host_memory)


def _hca_entry(host: str, hca, where: str, rate: float) -> HcaSpec:
    if isinstance(hca, str):
        hca = {"device": hca}
    if not isinstance(hca, dict) or not isinstance(hca.get("device"), str) or not HOST_NAME.match(hca["device"]):
        raise HostsError(f"{where}: expected a device name such as mlx5_0 or an object with one in 'device'")
    guid = hca.get("node_guid") or default_hca_guid(host, hca["device"])
    if not isinstance(guid, str) or len(guid) > 24:
        raise HostsError(f"{where}.node_guid: expected a GUID string")
    lid = hca.get("lid")
    if lid is not None:
        lid = _whole(lid, f"{where}.lid", 0, 65535)
    rate_gbps = hca.get("rate_gbps", rate)
    if isinstance(rate_gbps, bool) or not isinstance(rate_gbps, (int, float)) or not 0 < rate_gbps <= 100000:
        raise HostsError(f"{where}.rate_gbps: expected a positive number")
    return HcaSpec(hca["device"], guid, lid, float(rate_gbps))


def _gpu_entry(host: str, gpu, i: int, where: str, model: str, memory: int, devices: list[str]) -> GpuSpec:
    if not isinstance(gpu, dict):
        raise HostsError(f"{where}: expected an object")
    index = _whole(gpu.get("index", i), f"{where}.index", 0, 1023)
    uuid_ = gpu.get("uuid") or synthetic_gpu_uuid(host, index)
    if not isinstance(uuid_, str) or len(uuid_) > 80:
        raise HostsError(f"{where}.uuid: expected a GPU UUID string")
    gpu_model = gpu.get("model") or model
    if not isinstance(gpu_model, str) or len(gpu_model) > 80:
        raise HostsError(f"{where}.model: expected a model name")
    hca = gpu.get("nearest_hca", devices[index % len(devices)] if devices else "")
    if not isinstance(hca, str):
        raise HostsError(f"{where}.nearest_hca: expected a device name")
    return GpuSpec(index, uuid_, gpu_model, _whole(gpu.get("memory_mib", memory), f"{where}.memory_mib", 1), hca)


def _whole(value, where: str, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        bounds = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise HostsError(f"{where}: expected a whole number {bounds}, got {value!r}")
    return value


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()


def load_fabric_hosts(fabric_name: str) -> list[HostSpec]:
    """The FabricPool-agent hosts of a fabric as the server knows them (build_fattree
    registers them): GPUs with their UUIDs and nearest HCAs, adapters with GUIDs and LIDs."""
    _setup_django()
    from django.db import DatabaseError

    try:
        return _fabric_hosts(fabric_name)
    except DatabaseError as exc:
        raise HostsError(f"cannot read fabric {fabric_name!r} from the database: {exc} (is it migrated?)") from None


def _fabric_hosts(fabric_name: str) -> list[HostSpec]:
    from fabric.models import Fabric, Link, Port
    from pool.models import Gpu, Host

    fabric = Fabric.objects.filter(name=fabric_name).first()
    if fabric is None:
        names = list(Fabric.objects.order_by("name").values_list("name", flat=True)[:20])
        raise HostsError(f"no fabric named {fabric_name!r}; known: {', '.join(names) or 'none (run build_fattree)'}")
    hosts = {
        pk: name for pk, name in Host.objects.filter(fabric=fabric, in_fabric=True, agent_kind=Host.AgentKind.FABRICPOOL)
        .values_list("id", "name")
    }
    if not hosts:
        raise HostsError(f"fabric {fabric_name!r} has no hosts with a FabricPool agent (build_fattree registers them)")
    bad = sorted(name for name in hosts.values() if not HOST_NAME.match(name))
    if bad:
        raise HostsError(f"fabric {fabric_name!r}: host name {bad[0]!r} cannot be a URL path segment")

    gpus: dict[int, list[GpuSpec]] = {pk: [] for pk in hosts}
    for host_id, index, uuid_, model, memory, hca in Gpu.objects.filter(host__fabric=fabric, host__in_fabric=True).values_list(
        "host_id", "index", "uuid", "model", "memory_mib", "nearest_hca"
    ).order_by("host_id", "index"):
        if host_id in gpus:
            model = model or DEFAULT_GPU_MODEL
            gpus[host_id].append(GpuSpec(index, uuid_ or synthetic_gpu_uuid(hosts[host_id], index), model,
                                         memory or gpu_profile(model).memory_mib, hca))

    ports = {adapter_id: (pk, lid) for pk, adapter_id, lid in Port.objects.filter(fabric=fabric, adapter__isnull=False, number=1)
             .values_list("id", "adapter_id", "lid")}
    gbps = {}
    for a, b, rate in Link.objects.filter(fabric=fabric).exclude(gbps=None).values_list("port_a_id", "port_b_id", "gbps"):
        gbps[a] = gbps[b] = rate
    hcas: dict[int, list[HcaSpec]] = {pk: [] for pk in hosts}
    through = Host.adapters.through
    for host_id, adapter_id, description, guid in through.objects.filter(host__fabric=fabric).values_list(
        "host_id", "channeladapter_id", "channeladapter__description", "channeladapter__guid"
    ):
        if host_id not in hcas:
            continue
        words = description.split()
        device = words[1] if len(words) == 2 else f"mlx5_{len(hcas[host_id])}"
        port_id, lid = ports.get(adapter_id, (None, None))
        hcas[host_id].append(HcaSpec(device, agent_guid(int(guid, 16)), lid, float(gbps.get(port_id) or 400.0)))
    return [
        HostSpec(name, tuple(gpus[pk]), tuple(sorted(hcas[pk], key=lambda h: _natural(h.device))))
        for pk, name in sorted(hosts.items(), key=lambda item: _natural(item[1]))
    ]


def _natural(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def server_token_secret() -> tuple[str, str]:
    """The secret the server derives agent tokens from, and where it came from."""
    _setup_django()
    try:
        from pool.tokens import agent_secret
    except ModuleNotFoundError as exc:
        if exc.name not in ("pool.tokens",):
            raise
    else:
        return agent_secret(), "the server's (pool.tokens.agent_secret)"
    from django.conf import settings

    if getattr(settings, "AGENT_TOKEN_SECRET", ""):
        return settings.AGENT_TOKEN_SECRET, "settings.AGENT_TOKEN_SECRET"
    return hashlib.sha256(("fabricpool-agent-secret:" + settings.SECRET_KEY).encode()).hexdigest(), "derived from SECRET_KEY"


# -- the server -------------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int, message: str, path: str = "", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.path, self.headers = status, message, path, headers


@web.middleware
async def _json_errors(request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response({"error": exc.message, "path": exc.path}, status=exc.status, headers=exc.headers)
    except _Dropped:
        return web.Response(status=503)  # never sent: the connection is gone
    except web.HTTPException as exc:  # no such route, wrong method
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "path": ""}, status=exc.status, headers=_allow(exc))


def _allow(exc) -> dict:
    return {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}


class Simulator:
    """The virtual hosts, their tokens and faults, and the aiohttp app that serves them.
    `clock` gives the simulated time (unix seconds); tests pass one they can move."""

    def __init__(self, specs: list[HostSpec], *, secret: str, control_token: str | None = None, seed: int = 0,
                 clock=time.time, default_duration_s: float = DEFAULT_DURATION_S, failure_rate: float = 0.0,
                 startup_s: float = 1.0, stop_grace_s: float = 1.0):
        if not secret:
            raise ValueError("the token secret is empty")
        self.clock = clock
        self.seed = seed
        self.default_duration_s = default_duration_s
        now = clock()
        self.hosts = {
            s.name: SimHost(s, seed=seed, now=now, failure_rate=failure_rate, startup_s=startup_s, stop_grace_s=stop_grace_s)
            for s in specs
        }
        self.tokens = {name: derive_token(secret, name) for name in self.hosts}
        self.control_token = control_token or derive_token(secret, CONTROL_TOKEN_NAME)
        self._wake: dict[str, asyncio.Event] = {}  # hosts whose hanging requests a clear releases

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_json_errors], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_get("/h/{host}/v1/report", self.get_report)
        app.router.add_post("/h/{host}/v1/allocations", self.post_allocation)
        app.router.add_delete("/h/{host}/v1/allocations/{id}", self.delete_allocation)
        app.router.add_post("/h/{host}/v1/allocations/{id}/ack", self.ack_allocation)
        app.router.add_get("/control/faults", self.get_faults)
        app.router.add_post("/control/faults", self.post_fault)
        app.router.add_get("/control/hosts", self.get_hosts)
        app.router.add_get("/healthz", self.healthz)
        return app

    # -- the agent protocol --------------------------------------------------------------------

    async def _enter(self, request) -> SimHost:
        name = request.match_info["host"]
        host = self.hosts.get(name)
        if host is None:
            raise ApiError(404, f"no simulated host {name!r}", "host")
        if host.faults:
            await self._connection_faults(request, host)
        _check_bearer(request, self.tokens[name])
        return host

    async def get_report(self, request):
        host = await self._enter(request)
        faults = host.faults
        if faults:
            if "garbage" in faults:
                return self._garbage(host, faults["garbage"]["body"])
            if "oversized" in faults:
                return await self._oversized(request, host, faults["oversized"])
            if "trickle" in faults:
                return await self._trickle(request, host, faults["trickle"])
        body = json.dumps(host.report(self.clock()), separators=(",", ":")).encode()
        return web.Response(body=body, content_type="application/json")

    async def post_allocation(self, request):
        host = await self._enter(request)
        body = await _read_body(request, MAX_REQUEST_BYTES)
        try:
            wanted = parse_allocation_request(body)
        except ProtocolError as exc:
            raise ApiError(400, exc.message, exc.path) from None
        now = self.clock()
        try:
            alloc, created = host.start(wanted, now, self.default_duration_s)
        except AllocationError as exc:
            raise ApiError(exc.status, exc.message, exc.path) from None
        return web.json_response({"id": alloc.id, "state": alloc.state(now)}, status=202 if created else 200)

    async def delete_allocation(self, request):
        host = await self._enter(request)
        now = self.clock()
        alloc = host.stop(request.match_info["id"], now)
        if alloc is None:
            raise ApiError(404, f"no allocation {request.match_info['id']} on this host", "id")
        return web.json_response({"id": alloc.id, "state": alloc.state(now), "stop_requested": True}, status=202)

    async def ack_allocation(self, request):
        host = await self._enter(request)
        await _read_body(request, MAX_REQUEST_BYTES)  # ignored, but bounded like every body
        alloc_id = request.match_info["id"]
        try:
            known = host.ack(alloc_id, self.clock())
        except AllocationError as exc:
            raise ApiError(exc.status, exc.message, exc.path) from None
        if not known:
            raise ApiError(404, f"no allocation {alloc_id} on this host", "id")
        return web.json_response({"id": alloc_id, "acknowledged": True})

    # -- faults as the client sees them -------------------------------------------------------

    async def _connection_faults(self, request, host: SimHost) -> None:
        faults = host.faults
        if "down" in faults:
            _drop(request)
        if "hang" in faults:
            event = self._wake.setdefault(host.name, asyncio.Event())
            try:
                # A client that gives up cancels this handler (handler_cancellation), so
                # hanging requests do not pile up; max_s bounds the rest.
                await asyncio.wait_for(event.wait(), faults["hang"]["max_s"])
            except TimeoutError:
                _drop(request)
        if "slow" in faults:
            await asyncio.sleep(faults["slow"]["delay_s"])

    def _garbage(self, host: SimHost, kind: str) -> web.Response:
        if kind == "html":
            return web.Response(body=b"<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html")
        if kind == "binary":
            return web.Response(body=bytes(range(256)) * 4, content_type="application/json")
        if kind == "not_object":
            return web.Response(body=b'["not", "a", "report"]', content_type="application/json")
        report = host.report(self.clock())
        if kind == "wrong_schema":
            report["schema"] = "fabricpool.report/99"
        elif kind == "invalid_field" and report["gpus"]:
            report["gpus"][0]["utilization_pct"] = 250
        body = json.dumps(report, separators=(",", ":")).encode()
        if kind == "truncated":
            body = body[: len(body) * 3 // 5]
        return web.Response(body=body, content_type="application/json")

    async def _oversized(self, request, host: SimHost, params: dict) -> web.StreamResponse:
        """A valid-looking report padded to params.mb MB, written in 64 KiB chunks so that a
        50 MB body costs 64 KiB of memory, and stops as soon as the client hangs up."""
        head = (f'{{"schema":"fabricpool.report/1","host":"{host.name}","time":{self.clock():.3f},"padding":"').encode()
        chunks = max(1, int(params["mb"] * 1024 * 1024) // len(_PADDING))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if params["content_length"]:
            response.content_length = len(head) + chunks * len(_PADDING) + 2
        await response.prepare(request)
        try:
            await response.write(head)
            for _ in range(chunks):
                await response.write(_PADDING)
            await response.write(b'"}')
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def _trickle(self, request, host: SimHost, params: dict) -> web.StreamResponse:
        body = json.dumps(host.report(self.clock()), separators=(",", ":")).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        deadline = time.monotonic() + params["max_s"]
        try:
            for i in range(len(body)):
                if "trickle" not in host.faults or time.monotonic() > deadline:
                    await response.write(body[i:])  # cleared: the rest at once
                    break
                await response.write(body[i:i + 1])
                await asyncio.sleep(params["interval_s"])
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    # -- control ---------------------------------------------------------------------------------

    async def healthz(self, request):
        return web.json_response({"ok": True, "hosts": len(self.hosts)})

    async def get_hosts(self, request):
        _check_bearer(request, self.control_token)
        base = f"{request.scheme}://{request.host}"
        return web.json_response({"hosts": [
            {"name": name, "agent_url": f"{base}/h/{name}", "gpus": len(host.gpus)} for name, host in self.hosts.items()
        ]})

    async def get_faults(self, request):
        _check_bearer(request, self.control_token)
        return web.json_response({"faults": self.list_faults()})

    async def post_fault(self, request):
        _check_bearer(request, self.control_token)
        body = await _read_body(request, MAX_CONTROL_BYTES)
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ApiError(400, f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "expected a JSON object")
        names = self.select_hosts(data.get("host"))
        count = self.apply_fault(names, data.get("fault"), data.get("params"))
        return web.json_response({"fault": data["fault"], "hosts": count})

    def list_faults(self) -> list[dict]:
        return [
            {"host": name, "fault": kind, "params": {k: v for k, v in params.items() if k != "since"}, "since": params["since"]}
            for name, host in self.hosts.items() for kind, params in host.faults.items()
        ]

    def select_hosts(self, selector) -> list[str]:
        if selector == "*":
            return list(self.hosts)
        if isinstance(selector, str):
            selector = [selector]
        if not isinstance(selector, list) or not selector or not all(isinstance(n, str) for n in selector):
            raise ApiError(400, 'expected a host name, "*" or a non-empty list of host names', "host")
        unknown = [n for n in selector if n not in self.hosts]
        if unknown:
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise ApiError(404, f"no simulated host {', '.join(map(repr, unknown[:5]))}{more}", "host")
        return list(dict.fromkeys(selector))

    def apply_fault(self, names: list[str], fault, params) -> int:
        """Validate first, then change every host: a bad request changes nothing."""
        if fault not in FAULTS:
            raise ApiError(400, f"unknown fault {fault!r}; one of {', '.join(FAULTS)}", "fault")
        params = _fault_params(fault, {} if params is None else params)
        hosts = [self.hosts[n] for n in names]
        now = self.clock()
        if fault == "ecc":
            for host in hosts:
                if not 0 <= params["gpu"] < len(host.gpus):
                    raise ApiError(400, f"host {host.name} has no GPU {params['gpu']}", "params.gpu")
        port_of = {}
        if fault == "flap_ib":
            for host in hosts:
                devices = [p.spec.device for p in host.ports]
                port = params["port"]
                index = devices.index(port) if port in devices else port if isinstance(port, int) else -1
                if not 0 <= index < len(devices):
                    raise ApiError(400, f"host {host.name} has no IB port {port!r} (ports: {', '.join(devices) or 'none'})", "params.port")
                port_of[host.name] = index
        for host in hosts:
            if fault == "clear":
                host.clear(now)
                event = self._wake.pop(host.name, None)
                if event is not None:
                    event.set()
                continue
            if fault == "ecc":
                host.add_ecc(params["gpu"], params["count"], params["corrected"])
            elif fault == "flap_ib":
                host.flap(port_of[host.name], params["period_s"], now)
            host.faults[fault] = dict(params, since=round(now, 3))
        return len(hosts)


_FAULT_PARAMS = {  # name -> (default, check, what it must be)
    "down": {},
    "clear": {},
    "slow": {"delay_s": (2.0, lambda v: _num(v) and 0 <= v <= 3600, "a number of seconds 0..3600")},
    "hang": {"max_s": (3600.0, lambda v: _num(v) and 0 < v <= 86400, "a number of seconds 0..86400")},
    "trickle": {"interval_s": (1.0, lambda v: _num(v) and 0 < v <= 60, "a number of seconds 0..60"),
                "max_s": (3600.0, lambda v: _num(v) and 0 < v <= 86400, "a number of seconds 0..86400")},
    "garbage": {"body": ("truncated", lambda v: v in GARBAGE_BODIES, f"one of {', '.join(GARBAGE_BODIES)}")},
    "oversized": {"mb": (50.0, lambda v: _num(v) and 0 < v <= 4096, "a number of megabytes 0..4096"),
                  "content_length": (False, lambda v: isinstance(v, bool), "true or false")},
    "ecc": {"gpu": (0, lambda v: _int(v) and v >= 0, "a GPU index"),
            "count": (1, lambda v: _int(v) and 0 <= v <= 1_000_000, "a whole number 0..1000000"),
            "corrected": (0, lambda v: _int(v) and 0 <= v <= 1_000_000, "a whole number 0..1000000")},
    "flap_ib": {"port": (0, lambda v: _int(v) or isinstance(v, str), "a port index or device name"),
                "period_s": (5.0, lambda v: _num(v) and 0.01 <= v <= 3600, "a number of seconds 0.01..3600")},
}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fault_params(fault: str, given) -> dict:
    if not isinstance(given, dict):
        raise ApiError(400, "expected an object", "params")
    spec = _FAULT_PARAMS[fault]
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ApiError(400, f"fault {fault!r} takes no parameter {unknown[0]!r} (it takes: {', '.join(spec) or 'none'})",
                       f"params.{unknown[0]}")
    params = {}
    for key, (default, check, what) in spec.items():
        value = given.get(key, default)
        if not check(value):
            raise ApiError(400, f"expected {what}, got {value!r}", f"params.{key}")
        params[key] = value
    return params


def _check_bearer(request, expected: str) -> None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token_matches(token.strip(), expected):
        raise ApiError(401, "missing or wrong bearer token", "Authorization",
                       headers={"WWW-Authenticate": 'Bearer realm="fabricpool-agent"'})


async def _read_body(request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"body of {request.content_length} bytes is over the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"body is over the {limit}-byte limit")
    return bytes(body)


class _Dropped(Exception):
    pass


def _drop(request):
    """What a dead host looks like from the client: the connection closes, no response."""
    if request.transport is not None:
        request.transport.abort()
    raise _Dropped()


# -- the command ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent simulate",
        description="Serve one virtual FabricPool agent per host, all on one port (a path prefix per host).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hosts-file", metavar="FILE", help="JSON list of hosts, or one host name per line")
    source.add_argument("--fabric", metavar="NAME", help="the hosts of this fabric in the FabricPool database")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--token-secret-file", metavar="FILE",
                        help="the secret agent tokens are derived from (default: env FABRICPOOL_AGENT_SECRET; "
                             "with --fabric, the server's)")
    parser.add_argument("--control-token-file", metavar="FILE",
                        help='bearer token of /control (default: derive_token(secret, "simulator control"))')
    parser.add_argument("--seed", type=int, default=0, help="same seed, same cluster (default: %(default)s)")
    parser.add_argument("--gpus-per-host", type=int, default=8, help="for hosts-file hosts without a GPU count (default: %(default)s)")
    parser.add_argument("--gpu-model", default=DEFAULT_GPU_MODEL, help='for hosts-file hosts (default: "%(default)s")')
    parser.add_argument("--default-duration", type=float, default=DEFAULT_DURATION_S, metavar="SECONDS",
                        help="how long work runs when a request gives no duration_s (default: %(default)s)")
    parser.add_argument("--failure-rate", type=float, default=0.0, metavar="FRACTION",
                        help="share of allocations that exit with code 1 (default: %(default)s)")
    return parser


def _read_secret(path: str, what: str) -> str:
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostsError(f"{what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not secret:
        raise HostsError(f"{what} {path} is empty")
    return secret


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port < 65536:
        parser.error(f"--port {args.port}: give 1..65535 (0: any free port)")
    if not 0 <= args.failure_rate <= 1:
        parser.error(f"--failure-rate {args.failure_rate}: give a fraction 0..1")
    if args.default_duration < 0:
        parser.error(f"--default-duration {args.default_duration}: give seconds >= 0")
    if not 0 <= args.gpus_per_host <= 64:
        parser.error(f"--gpus-per-host {args.gpus_per_host}: give 0..64")
    try:
        if args.fabric:
            specs = load_fabric_hosts(args.fabric)
        else:
            specs = load_hosts_file(args.hosts_file, gpus_per_host=args.gpus_per_host, gpu_model=args.gpu_model)
        if args.token_secret_file:
            secret, where = _read_secret(args.token_secret_file, "--token-secret-file"), args.token_secret_file
        elif os.environ.get("FABRICPOOL_AGENT_SECRET"):
            secret, where = os.environ["FABRICPOOL_AGENT_SECRET"], "env FABRICPOOL_AGENT_SECRET"
        elif args.fabric:
            secret, where = server_token_secret()
        else:
            raise HostsError("no token secret: give --token-secret-file or set FABRICPOOL_AGENT_SECRET")
        control = _read_secret(args.control_token_file, "--control-token-file") if args.control_token_file else None
    except HostsError as exc:
        print(f"simulate: error: {exc}", file=sys.stderr)
        return 2
    sim = Simulator(specs, secret=secret, control_token=control, seed=args.seed,
                    default_duration_s=args.default_duration, failure_rate=args.failure_rate)
    try:
        asyncio.run(_serve(sim, args.bind, args.port, where, control is not None))
    except OSError as exc:
        print(f"simulate: error: cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(sim: Simulator, bind: str, port: int, secret_source: str, control_from_file: bool) -> None:
    runner = web.AppRunner(sim.app(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    # A poll round opens hundreds of connections at once: a deep accept queue.
    site = web.TCPSite(runner, bind, port, backlog=4096, shutdown_timeout=2.0)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]  # the real one when asked for port 0
    base = f"http://{bind if ':' not in bind else f'[{bind}]'}:{port}"
    gpus = sum(len(h.gpus) for h in sim.hosts.values())
    print(f"simulating {len(sim.hosts)} hosts ({gpus} GPUs), seed {sim.seed}", flush=True)
    print(f"agent URLs: {base}/h/{{host}}  (report at {base}/h/{{host}}/v1/report; "
          f"AGENT_URL_TEMPLATE={base}/h/{{host}})", flush=True)
    token = "--control-token-file" if control_from_file else 'derive_token(secret, "simulator control")'
    print(f"control: {base}/control/faults  (token: {token}); agent tokens from {secret_source}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    sys.exit(main())
