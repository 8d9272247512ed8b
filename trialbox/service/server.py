"""`trialbox serve`: one server process (uvicorn) around `create_app`.

    trialbox serve                                   # http://127.0.0.1:8080, no token
    TRIALBOX_TOKEN=s3cret trialbox serve --host 0.0.0.0 --port 8080

The listening socket is bound here, before the app starts, so `--port 0` works (the
chosen port is printed: `trialbox serve: listening on http://127.0.0.1:PORT`) and a
port already in use is a clear error at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.service.config import TIERS, ServiceConfig


def add_parser(sub: Any) -> None:
    """Hook `serve` into the CLI's subparsers."""
    d = ServiceConfig()
    p = sub.add_parser(
        "serve", help="the HTTP service: native /v1, SandboxFusion-compatible /run_code, "
        "E2B-compatible /sandboxes",
        description="Serve sandboxed runs and trusted grading over HTTP (docs/service.md). "
        "Bound to loopback by default; binding any other address requires a bearer token "
        "(--token or TRIALBOX_TOKEN).")
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, default=d.port,
                   help=f"port (default {d.port}; 0: any free port, printed)")
    p.add_argument("--token", default=None,
                   help="bearer token required on every request (default: $TRIALBOX_TOKEN)")
    p.add_argument("--max-running", type=int, default=d.max_running,
                   help=f"sandboxed requests executing at once (default {d.max_running})")
    p.add_argument("--max-queued", type=int, default=d.max_queued,
                   help=f"requests waiting for a slot before 503 (default {d.max_queued})")
    p.add_argument("--deadline-s", type=float, default=d.deadline_s,
                   help=f"per-request deadline, s (default {d.deadline_s:g}; clients may "
                   "ask for less with X-Deadline-S)")
    p.add_argument("--rate", type=float, default=d.rate_per_s,
                   help=f"per-client requests/s (default {d.rate_per_s:g})")
    p.add_argument("--burst", type=int, default=d.rate_burst,
                   help=f"per-client burst (default {d.rate_burst})")
    p.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / (1 << 20),
                   help=f"largest request body, MiB (default {d.max_body_bytes >> 20})")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions,
                   help=f"open /v1/sessions at once (default {d.max_sessions})")
    p.add_argument("--max-sessions-per-client", type=int, default=None,
                   help="open /v1/sessions one client (address) may hold (default: half "
                   "of --max-sessions)")
    p.add_argument("--read-timeout-s", type=float, default=d.read_timeout_s,
                   help="seconds a client may take to send a request's headers, or pause "
                   f"in its body (default {d.read_timeout_s:g})")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a name the server also answers to without a token (a reverse "
                   "proxy's), besides the bound address, localhost, 127.0.0.1 and ::1; "
                   "repeat for more (default: $TRIALBOX_ALLOWED_HOSTS, comma-separated)")
    p.add_argument("--warm", type=int, default=d.warm,
                   help=f"sandbox cells kept warm (default {d.warm}; --backend ray: in each "
                   "node's pool)")
    p.add_argument("--records", default=None, metavar="DB",
                   help="keep graded submissions in this SQLite file (survives restarts; "
                   "default: in memory)")
    p.add_argument("--max-memory-mb", type=int, default=d.max_limits.memory_mb,
                   help="the most memory a request may ask for, MiB (SandboxFusion's "
                   f"memory_limit_MB, /v1 limits.memory_mb; default {d.max_limits.memory_mb})")
    p.add_argument("--tier", default=d.tier, choices=TIERS,
                   help=f"isolation tier of every sandbox (default {d.tier}; grading "
                   "needs namespace)")
    p.add_argument("--journal", default=None, metavar="DB",
                   help="the scheduler's journal: every sandbox-using request is a task "
                   "in it (trialbox tasks status RUN --db DB); default: a temporary file "
                   "deleted at shutdown")
    from trialbox.cluster.cli import add_cluster_arguments
    add_cluster_arguments(p, "every sandbox (grading, /run_code, /v1/sessions) placed")
    p.add_argument("--log-level", default="warning", help="uvicorn log level")


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    d_max = ServiceConfig().max_limits
    token = args.token if args.token is not None else os.environ.get("TRIALBOX_TOKEN")
    hosts = args.allowed_host if args.allowed_host is not None else [
        n.strip() for n in os.environ.get("TRIALBOX_ALLOWED_HOSTS", "").split(",")
        if n.strip()]
    return ServiceConfig(host=args.host, port=args.port, token=token or None,
                         max_sessions=args.max_sessions,
                         max_sessions_per_client=args.max_sessions_per_client,
                         read_timeout_s=args.read_timeout_s, allowed_hosts=tuple(hosts),
                         max_running=args.max_running, max_queued=args.max_queued,
                         deadline_s=args.deadline_s, rate_per_s=args.rate,
                         rate_burst=args.burst, max_body_bytes=int(args.max_body_mb * (1 << 20)),
                         warm=args.warm, records=args.records,
                         journal=args.journal, tier=args.tier,
                         max_limits=d_max.with_(memory_mb=args.max_memory_mb))


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}; pick another "
                         "--port (or 0 for any free one)") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve(config: ServiceConfig, log_level: str = "warning",
                cluster: Any = None) -> None:
    """`cluster` (a `ClusterConfig`, --backend ray): every sandbox the server uses —
    grading, one-shot runs, sessions — lives on its nodes (cluster/serving.py), and
    this process starts no pool of its own; joined before the port is bound, so a bad
    address starts nothing. `config.warm` is then each node's warm cells."""
    if cluster is None:
        await _serve(config, log_level)
        return
    from dataclasses import replace

    from trialbox.cluster.serving import ClusterServing
    serving = await ClusterServing.start(replace(cluster, warm=config.warm), config.tier)
    try:
        print(f"trialbox serve: grading on {len(serving.backend.placer.nodes)} Ray "
              f"node(s) at {cluster.address} (tier {config.tier}); /run_code and "
              "/v1/sessions run there too (no sandbox pool here)", flush=True)
        await _serve(config, log_level, serving.provider, serving.grader)
    finally:
        await serving.close()


async def _serve(config: ServiceConfig, log_level: str, provider: Any = None,
                 grader: Any = None) -> None:
    # Imported here: `trialbox --help` must not pay for FastAPI, uvicorn and the judge.
    import uvicorn

    from trialbox.service.app import create_app
    from trialbox.service.connection import header_deadline
    from trialbox.telemetry.logs import setup_logging
    # Our own log records as JSON lines with the current trace id (uvicorn's access log
    # keeps its format): one run leads from the dashboard to its trace to its lines.
    setup_logging("DEBUG" if log_level == "trace" else log_level.upper())
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config, provider=provider,
                                                      grader=grader),
                                           log_level=log_level,
                                           http=header_deadline(config.read_timeout_s),
                                           # the client is the peer's address: never
                                           # X-Forwarded-For, which uvicorn believes
                                           # from 127.0.0.1 (any local client)
                                           proxy_headers=False,
                                           timeout_graceful_shutdown=10,
                                           timeout_keep_alive=30))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        shown = f"[{config.host}]" if ":" in config.host else config.host
        print(f"trialbox serve: listening on http://{shown}:{port}", flush=True)

    watcher = asyncio.create_task(announce())
    try:
        # Served from this coroutine, not a task: when the app's startup fails, uvicorn
        # calls sys.exit(3), which must reach main() below rather than an orphan task.
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()


def main(args: argparse.Namespace) -> int:
    from trialbox.cluster.cli import cluster_config
    config = config_from_args(args)
    cluster = cluster_config(args)  # --backend ray: checked before anything starts
    try:
        asyncio.run(serve(config, args.log_level, cluster))
    except SystemExit as e:  # uvicorn's exit when the app could not start
        if e.code in (0, None):
            return 0
        if cluster is not None and e.code == signal.SIGTERM:
            # ray.init's SIGTERM handler (sys.exit(15)), run when uvicorn re-raises the
            # signal after its graceful shutdown: the cluster grader is closed by now
            return 0
        raise InfraError("the server did not start: its lifespan failed (the sandbox "
                         "pool could not be started; the error is logged above)") from None
    return 0


if __name__ == "__main__":
    # `python -m trialbox.service.server [options]`: the same options as `trialbox serve`,
    # parsed here rather than through trialbox.cli, which sits above this layer.
    _parser = argparse.ArgumentParser(prog="python -m trialbox.service.server")
    add_parser(_parser.add_subparsers(dest="command"))
    sys.exit(main(_parser.parse_args(["serve", *sys.argv[1:]])))
