"""`kernel-referee service --root DIR [--port 8000] [--host 127.0.0.1] [--ray ADDRESS]`: the audit service, served by
uvicorn; with --ray, each run's GPU work on a Ray cluster (service/ray_executor.py). Its errors are one line and an
exit code, as every command's (README, "Exit codes"): 2 for bad arguments or a --root that cannot be made, 5 for a
port another process listens on, both before anything is made."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable
from functools import partial

from harness.gpus import list_gpus
from harness.placement import GpuInfo
from harness.settings import TimingSettings
from harness.task_model import Task
from server.cli_args import PORT, Parser
from server.cli_errors import failed
from server.executor import Executor, GpuExecutor
from server.settings import sandbox_refusal
from server.transport import listen, loopback_refusal, serve_app
from service.app import build_app
from service.ray_executor import GPU, NoClusterGpu, join_fleet, node_gpu_executor
from service.settings import ServiceSettings
from service.web import web_routes

COMMANDS = ("service",)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="kernel-referee service", description=(
        "Serve the audit service: runs queued for the host's GPUs, each driven by its own agent through its own MCP "
        "endpoint (/runs/ID/mcp), a JSON API (/api/openapi.json) and the web pages. State lives under --root."))
    p.add_argument("--root", required=True, help="the service's folder: its runs, tokens and their run folders")
    p.add_argument("--host", default="127.0.0.1", help="loopback only (default 127.0.0.1)")
    p.add_argument("--port", type=PORT, default=8000, help="1 to 65535 (default 8000)")
    p.add_argument("--no-sandbox", action="store_true", help="run the GPU workers unconfined (recorded in each run)")
    p.add_argument("--ray", metavar="ADDRESS", help="run each run's GPU work on this Ray cluster's GPU nodes ('auto': "
                   "the one this host runs); the queue's slots are the cluster's GPUs. Needs kernel-referee[fleet]")
    p.add_argument("--ray-resource", default=GPU, help="what each run's actor asks one of (default GPU; a custom "
                   "resource of the cluster stands in for GPUs)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args((sys.argv[2:] if argv is None else argv))
    try:
        return _main(args)
    except BaseException as exc:  # noqa: BLE001 - one line and its exit code (server/cli_errors.py); SystemExit passes
        return failed("kernel-referee service", exc)


def _main(args: argparse.Namespace) -> int:
    refusal = loopback_refusal(args.host) or sandbox_refusal(not args.no_sandbox)
    if refusal:
        print(f"kernel-referee: {refusal}", file=sys.stderr)
        return 2
    settings = ServiceSettings(root=args.root, host=args.host, port=args.port)
    listener = listen(settings.host, settings.port)  # a busy port is refused (PortInUse) before a cluster is joined
    try:
        if args.ray is not None:
            try:
                fleet, slots = join_fleet(args.ray, partial(node_gpu_executor, confine=not args.no_sandbox),
                                          args.ray_resource)
            except NoClusterGpu as exc:
                print(f"kernel-referee: {exc}", file=sys.stderr)
                return 2
            return serve(settings, fleet.make_executor, slots, fleet.slots, listener=listener)

        def make_executor(task: Task, timing: TimingSettings, gpu: GpuInfo | None) -> Executor:
            return GpuExecutor(task, timing, confine=not args.no_sandbox, gpu=gpu)

        return serve(settings, make_executor, list_gpus(), listener=listener)
    finally:
        listener.close()  # uvicorn closed it at its stop; else nothing served on it


def serve(settings: ServiceSettings, make_executor, gpus: list[GpuInfo],
          slots_now: Callable[[], list[GpuInfo]] | None = None, listener: socket.socket | None = None) -> int:
    """Build the app and serve it until stopped; the admin token, when generated, printed this once. `slots_now`: a
    cluster's GPUs, counted again while serving; `listener`: the port, bound already (else bound here)."""
    listener = listener or listen(settings.host, settings.port)  # a busy port is refused before anything is made
    try:
        settings.root.mkdir(parents=True, exist_ok=True)
        app = build_app(settings, make_executor, gpus, routes=web_routes(), slots_now=slots_now)
    except BaseException:
        listener.close()
        raise
    shown = app.state.service.tokens.admin_token_to_show()
    print(f"kernel-referee service: serving at {settings.base_url} (API: {settings.base_url}/api/openapi.json)",
          file=sys.stderr, flush=True)
    if shown:
        print(f"kernel-referee service: admin token (shown once; set KERNEL_REFEREE_ADMIN_TOKEN to choose it): {shown}",
              file=sys.stderr, flush=True)
    serve_app(app, settings.host, settings.port, "warning", listener)
    return 0
