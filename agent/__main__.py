"""`python -m agent serve ...` runs the host agent; `python -m agent simulate ...` the simulator."""
from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path

from agent import __version__
from agent.report import GPU_SOURCES


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from agent.server import AgentConfig, ConfigError, load_token, make_app

    try:
        token = load_token(args.token_file)
        config = AgentConfig(
            host_name=args.host_name or socket.gethostname().split(".")[0],
            token=token,
            log_dir=Path(args.log_dir),
            sysfs_root=Path(args.sysfs_root),
            gpu_source=args.gpu_source,
            grace_s=args.grace_seconds,
        )
        app = make_app(config)
    except ConfigError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"agent: cannot use log directory {args.log_dir}: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("agent").info(
        "fabricpool agent %s for host %s on %s:%s, logs in %s", __version__, config.host_name, args.bind, args.port, config.log_dir)
    web.run_app(app, host=args.bind, port=args.port, print=None, access_log=None)
    return 0


def _simulate(argv: list[str]) -> int:
    from agent.simulate import main  # imported here: `serve` must not depend on the simulator

    return main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        return _simulate(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m agent", description="FabricPool host agent")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve this host's report and run its allocations")
    serve.add_argument("--port", type=int, default=9400)
    serve.add_argument("--bind", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--token-file", required=True, help="file holding this host's bearer token (chmod 600)")
    serve.add_argument("--host-name", help="name reported for this host (default: the short hostname)")
    serve.add_argument("--log-dir", default="/var/lib/fabricpool-agent",
                       help="allocation logs and the agent's state file (default /var/lib/fabricpool-agent)")
    serve.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted (default /sys)")
    serve.add_argument("--gpu-source", choices=GPU_SOURCES, default="auto",
                       help="auto: NVML, else nvidia-smi, else no GPUs")
    serve.add_argument("--grace-seconds", type=float, default=10.0,
                       help="how long a stopped allocation gets between SIGTERM and SIGKILL (default 10)")
    serve.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    commands.add_parser("simulate", help="serve a simulated cluster of agents (see --help there)", add_help=False)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
