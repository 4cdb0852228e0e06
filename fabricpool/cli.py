"""fabricpool: submit, watch and cancel jobs and look at hosts through FabricPool's REST API.

    export FABRICPOOL_URL=https://fabricpool.example.org FABRICPOOL_TOKEN=fpt_...
    fabricpool submit --tenant physics --pool main --gpus 8 --max-leaves 1 -- python train.py
    fabricpool queue --user alice
    fabricpool status 42
    fabricpool cancel 42
    fabricpool hosts --state draining --json

The URL and token come from --url/--token, else FABRICPOOL_URL/FABRICPOOL_TOKEN, else the
config file (FABRICPOOL_CONFIG, default ~/.config/fabricpool/config.toml):

    url = "https://fabricpool.example.org"
    token = "fpt_..."

Standard library only (urllib), so it runs on any machine with Python 3.11.
Exit status: 0 done, 1 refused or failed (the API's message is printed), 2 bad usage."""
from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0
ACTIVE_STATES = "pending,preempted,proposed,approved,dispatching,running"
JOB_STATES = ("pending", "proposed", "approved", "dispatching", "running", "succeeded", "failed", "cancelled",
              "preempted")
HOST_STATES = ("up", "stale", "unreachable", "draining", "down", "new")


class CliError(Exception):
    """A failure to report in one or a few lines (no traceback)."""


# --- configuration --------------------------------------------------------------------------


def config_path() -> Path:
    if os.environ.get("FABRICPOOL_CONFIG"):
        return Path(os.environ["FABRICPOOL_CONFIG"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "fabricpool" / "config.toml"


def load_config(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"cannot read the config file {path}: {exc}") from None
    unknown = set(data) - {"url", "token"}
    if unknown:
        raise CliError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}; expected url and token")
    if "token" in data and path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        print(f"warning: {path} holds a token and others can read it: chmod 600 {path}", file=sys.stderr)
    return data


def settings(args) -> tuple[str, str]:
    config = load_config(config_path())
    url = args.url or os.environ.get("FABRICPOOL_URL") or config.get("url") or DEFAULT_URL
    token = args.token or os.environ.get("FABRICPOOL_TOKEN") or config.get("token") or ""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise CliError(f"the FabricPool URL {url!r} is not an http(s) URL, e.g. https://fabricpool.example.org")
    if not token:
        raise CliError("no API token: set FABRICPOOL_TOKEN, pass --token, or put token = \"...\" in "
                       f"{config_path()}. Create a token at {url.rstrip('/')}/api/tokens/")
    return url.rstrip("/"), token


# --- HTTP -----------------------------------------------------------------------------------


class Api:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def request(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        target = path if path.startswith("http") else f"{self.url}/api/v1/{path.lstrip('/')}"
        if query:
            target += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v not in (None, "")})
        if urllib.parse.urlparse(target).scheme not in ("http", "https"):
            raise CliError(f"refusing to follow {target[:100]!r}: not an http(s) URL")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(target, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:  # nosec B310 - http(s) checked above
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise CliError(self._explain(exc)) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            why = "connection refused" if isinstance(reason, ConnectionRefusedError) else str(reason)
            raise CliError(f"cannot reach FabricPool at {self.url}: {why}. Is the URL right "
                           "(--url or FABRICPOOL_URL) and the server up?") from None
        except (TimeoutError, socket.timeout):
            raise CliError(f"FabricPool at {self.url} did not answer within {TIMEOUT_S:.0f} s") from None
        except json.JSONDecodeError:
            raise CliError(f"{target} did not answer with JSON: is {self.url} a FabricPool server?") from None

    def _explain(self, exc: urllib.error.HTTPError) -> str:
        try:
            error = json.loads(exc.read()).get("error") or {}
        except (json.JSONDecodeError, AttributeError, ValueError):
            error = {}
        message = error.get("message") or f"HTTP {exc.code} {exc.reason}"
        if exc.code == 401:
            return f"the API refused the token: {message} Create a new token at {self.url}/api/tokens/"
        lines = [message]
        for field, problems in (error.get("fields") or {}).items():
            lines.append(f"  {field}: {'; '.join(problems)}")
        if exc.code == 429 and exc.headers.get("Retry-After"):
            lines.append(f"  (try again in {exc.headers['Retry-After']} s)")
        return "\n".join(lines)

    def pages(self, path: str, query: dict, limit: int) -> list[dict]:
        """Follow `next` links until `limit` rows."""
        rows: list[dict] = []
        body = self.request("GET", path, query={**query, "page_size": min(limit, 500)})
        while True:
            rows.extend(body.get("results", []))
            if len(rows) >= limit or not body.get("next"):
                return rows[:limit]
            body = self.request("GET", body["next"])


# --- output ---------------------------------------------------------------------------------


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Plain aligned columns: (header, key) pairs; None shows as "-"."""
    cells = [[h for h, _ in columns]] + [["-" if r.get(k) in (None, "") else str(r.get(k)) for _, k in columns]
                                         for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def short_time(value: str | None) -> str | None:
    return value.replace("T", " ")[:19] if value else value


def show(args, data, human: str) -> None:
    print(json.dumps(data, indent=2) if args.json else human)


# --- commands -------------------------------------------------------------------------------


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--env {pair!r}: expected NAME=value")
        env[key] = value
    return env


def cmd_submit(api: Api, args) -> None:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("give the command to run after --, e.g. fabricpool submit ... -- python train.py")
    body = {"tenant": args.tenant, "pool": args.pool, "gpus": args.gpus, "command": command,
            "env": parse_env(args.env), "name": args.name or "", "gpu_models": args.gpu_model or [],
            "min_memory_mib": args.min_memory_mib, "fp64": args.fp64 or "", "site": args.site or "",
            "priority": args.priority, "gang": not args.no_gang, "whole_hosts": not args.shared_hosts,
            "preemptible": args.preemptible, "max_leaves": args.max_leaves, "topology_hard": args.hard,
            "max_wait_s": args.max_wait, "estimated_runtime_s": args.estimated_runtime,
            "max_runtime_s": args.max_runtime, "gpu_milli": args.gpu_share, "gpu_memory_mib": args.gpu_memory,
            "mig_profile": args.mig, "grace_period_s": args.grace}
    # Flags only when given, so an older server that lacks them still takes the job.
    for flag in ("restartable", "allow_remote_site"):
        if getattr(args, flag):
            body[flag] = True
    if args.task_class:
        body["task_class"] = args.task_class
    body = {k: v for k, v in body.items() if v is not None}
    job = api.request("POST", "jobs/", body)
    show(args, job, f"submitted job {job['id']}: {job['gpus']} GPUs in pool {job['pool']} for {job['tenant']} "
                    f"({job['state']}). Follow it with: fabricpool status {job['id']}")


def share_text(job: dict) -> str:
    """"MIG 1g.10gb" or "250/1000 of one GPU, 8000 MiB"; "" for whole GPUs (or an older server)."""
    if job.get("mig_profile"):
        return f"MIG {job['mig_profile']}"
    parts = [f"{job['gpu_milli']}/1000 of one GPU"] if job.get("gpu_milli") else []
    parts += [f"{job['gpu_memory_mib']} MiB of GPU memory"] if job.get("gpu_memory_mib") else []
    return ", ".join(parts)


def job_text(job: dict) -> str:
    lines = [f"job {job['id']}" + (f" ({job['name']})" if job.get("name") else "") + f": {job['state']}",
             f"  tenant {job['tenant']}, pool {job['pool']}, {job['gpus']} GPUs, priority {job['priority']}",
             *([f"  sharing: {share_text(job)}"] if share_text(job) else []),
             f"  command: {' '.join(job['command'])}",
             f"  submitted {short_time(job['created_at'])} by {job.get('submitted_by') or '-'}"]
    if job.get("pending_message") and job["state"] in ("pending", "preempted"):
        lines.append(f"  waiting: {job['pending_message']}")
    if job.get("expected_start"):
        lines.append(f"  expected start: {short_time(job['expected_start'])}")
    if job.get("message"):
        lines.append(f"  {job['message']}")
    if job.get("exit_code") is not None:
        lines.append(f"  exit code {job['exit_code']}")
    for p in job.get("placements", []):
        lines.append(f"  placement {p['id']} {p['state']} (version {p['version']}): {len(p['gpus'])} GPUs on "
                     f"{p['hosts']} hosts, {p['leaves']} leaf switches")
    return "\n".join(lines)


def job_id(text: str) -> int:
    if not text.isdigit() or len(text) > 18:
        raise CliError(f"{text!r} is not a job id (a whole number, as `fabricpool queue` shows)")
    return int(text)


def cmd_status(api: Api, args) -> None:
    job = api.request("GET", f"jobs/{job_id(args.job)}/")
    show(args, job, job_text(job))


def cmd_cancel(api: Api, args) -> None:
    job = api.request("POST", f"jobs/{job_id(args.job)}/cancel/")
    show(args, job, f"job {job['id']} is {job['state']}" + (f": {job['message']}" if job.get("message") else ""))


def cmd_queue(api: Api, args) -> None:
    query = {"pool": args.pool, "tenant": args.tenant, "user": args.user,
             "states": args.state or (None if args.all else ACTIVE_STATES)}
    jobs = api.pages("jobs/", query, args.limit)
    rows = [{**j, "created_at": short_time(j["created_at"]),
             "why": j["pending_message"] if j["state"] in ("pending", "preempted") else ""} for j in jobs]
    human = table(rows, [("ID", "id"), ("NAME", "name"), ("STATE", "state"), ("TENANT", "tenant"), ("POOL", "pool"),
                         ("GPUS", "gpus"), ("PRIO", "priority"), ("SUBMITTED", "created_at"), ("USER", "submitted_by"),
                         ("WHY WAITING", "why")]) if rows else "no jobs"
    show(args, jobs, human)


def cmd_hosts(api: Api, args) -> None:
    hosts = api.pages("hosts/", {"state": args.state, "pool": args.pool}, args.limit)
    rows = [{**h, "last_report_at": short_time(h["last_report_at"])} for h in hosts]
    human = table(rows, [("NAME", "name"), ("STATE", "state"), ("POOL", "pool"), ("GPUS", "gpus"),
                         ("ALLOCATED", "gpus_allocated"), ("LAST REPORT", "last_report_at"),
                         ("LAST ERROR", "last_error")]) if rows else "no hosts"
    show(args, hosts, human)


# --- arguments ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fabricpool", description="Talk to a FabricPool control plane.",
                                  epilog="URL and token: --url/--token, FABRICPOOL_URL/FABRICPOOL_TOKEN, or "
                                         "~/.config/fabricpool/config.toml (url = ..., token = ...).")
    top.add_argument("--url", help="FabricPool's address, e.g. https://fabricpool.example.org")
    top.add_argument("--token", help="API token (prefer FABRICPOOL_TOKEN: arguments show in ps)")
    top.add_argument("--json", action="store_true", help="print the API's JSON instead of text")
    sub = top.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="submit a job", description="Submit a job; the command follows --.")
    s.add_argument("--tenant", required=True)
    s.add_argument("--pool", required=True)
    s.add_argument("--gpus", type=int, required=True)
    s.add_argument("--name")
    s.add_argument("--gpu-model", action="append", metavar="MODEL", help="any of these models (repeat)")
    s.add_argument("--min-memory-mib", type=int)
    s.add_argument("--fp64", choices=["high", "low"])
    s.add_argument("--site")
    s.add_argument("--task-class", choices=["training", "inference", "simulation", "science", "rendering"])
    s.add_argument("--priority", type=int)
    s.add_argument("--max-leaves", type=int, help="at most this many leaf switches")
    s.add_argument("--hard", action="store_true", help="never relax --max-leaves")
    s.add_argument("--max-wait", type=int, metavar="SECONDS", help="relax --max-leaves after this wait")
    s.add_argument("--estimated-runtime", type=int, metavar="SECONDS")
    s.add_argument("--max-runtime", type=int, metavar="SECONDS")
    s.add_argument("--preemptible", action="store_true")
    s.add_argument("--no-gang", action="store_true", help="may start on fewer GPUs than asked")
    s.add_argument("--shared-hosts", action="store_true", help="a multi-host job need not take whole hosts")
    s.add_argument("--gpu-share", type=int, metavar="MILLI",
                   help="a share of one GPU in thousandths, 1-999 (with --gpus 1), e.g. 250")
    s.add_argument("--gpu-memory", type=int, metavar="MIB", help="GPU memory the shared job needs, MiB")
    s.add_argument("--mig", metavar="PROFILE", help="a MIG instance of this profile, e.g. 1g.10gb (with --gpus 1)")
    s.add_argument("--restartable", action="store_true", help="may be stopped and restarted elsewhere (rebalancing)")
    s.add_argument("--allow-remote-site", action="store_true",
                   help="may run at another site after --max-wait (needs --site)")
    s.add_argument("--grace", type=int, metavar="SECONDS", help="SIGTERM to SIGKILL on stop (default: 30)")
    s.add_argument("--env", action="append", metavar="NAME=VALUE")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    s.set_defaults(run=cmd_submit)

    s = sub.add_parser("status", help="one job's state, why it waits, its placements")
    s.add_argument("job")
    s.set_defaults(run=cmd_status)

    s = sub.add_parser("cancel", help="cancel a job")
    s.add_argument("job")
    s.set_defaults(run=cmd_cancel)

    s = sub.add_parser("queue", help="unfinished jobs, newest first")
    s.add_argument("--pool")
    s.add_argument("--tenant")
    s.add_argument("--user", help="jobs submitted by this user name")
    s.add_argument("--state", help=f"state(s), comma-separated: {', '.join(JOB_STATES)}")
    s.add_argument("--all", action="store_true", help="finished jobs too")
    s.add_argument("--limit", type=int, default=200)
    s.set_defaults(run=cmd_queue)

    s = sub.add_parser("hosts", help="hosts with their state and GPUs")
    s.add_argument("--state", choices=HOST_STATES)
    s.add_argument("--pool")
    s.add_argument("--limit", type=int, default=1000)
    s.set_defaults(run=cmd_hosts)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "limit", 1) < 1:
        print("fabricpool: error: --limit must be at least 1", file=sys.stderr)
        return 2
    try:
        url, token = settings(args)
        args.run(Api(url, token), args)
    except CliError as exc:
        print(f"fabricpool: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
