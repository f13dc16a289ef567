"""A service run's live side, made lazily: the referee's Run (begun through server/lifecycle.py, or resumed) and
its MCP server, built by the same factory `serve` uses (server/app.py `build_server`), served as streamable
HTTP at /runs/{id}/mcp. A queued run has a Run begun but not prepared: its preparation says it is queued, so
describe_task answers, compile_kernel compiles on the CPU for the arch the run will have (server/early_compiles.py),
and every tool that needs the GPU refuses at once, with nothing spent."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import anyio
from mcp.server.auth.settings import AuthSettings
from starlette.applications import Starlette

from harness.compile_cache import CompileCache
from harness.placement import GpuInfo
from harness.settings import TimingSettings
from harness.task import load_task
from harness.task_model import Task
from server.app import build_server
from server.early_compiles import EarlyCompiles
from server.executor import Executor, ExecutorError
from server.lifecycle import begin_new_run, resume_run
from server.lock import read_lock
from server.preparation import NotPrepared, Preparation, prepare_behind
from server.run import Run, RunSettings
from server.transport import transport_security
from service.auth import SCOPE, RunTokenVerifier
from service.settings import ServiceSettings

MakeExecutor = Callable[[Task, TimingSettings, GpuInfo | None], Executor]


class RunGpuBusy(ExecutorError):
    """The GPU a resumed run began on is held by another process now: the run waits, and is tried again."""


class RunNodeGone(ExecutorError):
    """The node a resumed run began on left the cluster, its GPU with it: the run cannot go on."""


class Queued(Preparation):
    """A run waiting for a GPU, in place of its preparation until it gets one: never ready; compile_kernel answers
    (for `arch`, the arch of every GPU it may get; none where that is not known), every other tool that needs the
    run is refused at once."""

    def __init__(self, where: Callable[[], tuple[int, int, float]], arch: str | None = None,
                 journal: Path | None = None):
        super().__init__(lambda _progress: None, wait_s=0.0)
        self._where = where  # (position, queue length, expected wait in seconds)
        # The compiles answered before the service last stopped are the run's still: read back from its journal
        self.early = None if not arch else (EarlyCompiles(arch) if journal is None
                                            else EarlyCompiles.reload(arch, journal))

    def _describe(self) -> str:
        position, length, wait_s = self._where()
        return (f"queued for a GPU: position {position} of {length}, expected wait about "
                f"{math.ceil(wait_s / 60)} min")

    def expected_left_s(self) -> float | None:
        return self._where()[2]

    def status(self):
        return super().status().model_copy(update={"state": "queued", "step": self._describe()})

    def refusal(self) -> NotPrepared:
        meanwhile = "compile_kernel answers now; " if self.early is not None else ""
        return NotPrepared(f"the run is {self._describe()}. Its GPU tools answer once it has a GPU and is prepared; "
                           f"nothing was spent (no attempt or probe counted). {meanwhile}describe_task shows the "
                           "queue.")


class LiveRun:
    """One run's Run and MCP app; `app_task` serves the app's lifespan (its session manager) until `stop`."""

    def __init__(self, run: Run, app: Starlette):
        self.run, self.app = run, app
        self.stop = anyio.Event()
        self.admitted = False

    @property
    def run_dir(self) -> Path:
        return self.run.dir


def open_queued(task_dir: Path, results: Path, run_settings: RunSettings, make_executor: MakeExecutor,
                where: Callable[[], tuple[int, int, float]], journal: Path | None = None) -> Run:
    """A new run begun (its `.preparing-*` folder, its task copy and key; no GPU work), waiting in the queue; the
    compiles it answers meanwhile kept in `journal` until its run folder holds them."""
    executor = make_executor(load_task(task_dir), run_settings.timing, None)
    run = begin_new_run(task_dir, results, run_settings, executor)
    # An executor placed only when its run gets a GPU may not know the arch before: it answers no compile meanwhile
    arch = executor.compile_arch() if hasattr(executor, "compile_arch") else None
    run.preparation = Queued(where, arch, journal)
    return run


def admit(run: Run, results: Path, gpu: GpuInfo | None, make_executor: MakeExecutor) -> None:
    """The run got its GPU: its executor placed there (with the compiles made while it waited in its cache), then
    its preparation (reference outputs, baseline) behind the server, as `serve` does; the candidates compiled while
    it waited become the run's once it is prepared."""
    placed = make_executor(run.task, run.settings.timing, gpu)
    early = run.preparation.early if run.preparation is not None else None
    unplaced = run.executor
    try:
        with run.exclusive():  # a compile answered while queued ends before the executor changes
            if early is not None:
                early.close()
            run.executor = placed
            _carry_compiles(unplaced, placed)
            prepare_behind(run, results, on_ready=early.record_into if early is not None else None)
    except BaseException:  # not admitted: the run keeps its queued executor, the placed one is closed
        run.executor = unplaced
        placed.close()
        raise
    unplaced.close()


def _carry_compiles(unplaced: Executor, placed: Executor) -> None:
    """The placed executor's cache holds what the unplaced one compiled: a compile after admission is the same."""
    before, after = getattr(unplaced, "cache", None), getattr(placed, "cache", None)
    if isinstance(before, CompileCache) and isinstance(after, CompileCache):
        after.absorb(before)


def reopen(run_dir: Path, gpu: GpuInfo | None, make_executor: MakeExecutor, journal: Path | None = None) -> Run:
    """A run folder the service made before it stopped, resumed on its own GPU with its own budget; compiles it
    answered while queued and had not recorded yet (the service stopped just as it was prepared) recorded now."""
    task = load_task(run_dir / "task")
    executor = make_executor(task, RunSettings.of_run(run_dir).timing, gpu)
    began_on = getattr(executor, "began_on", None)  # an executor on a cluster goes back to where the run began
    try:
        if began_on is not None:
            began_on(read_lock(run_dir).get("environment", {}))
        run = resume_run(run_dir, executor)
        if journal is not None and journal.exists():
            EarlyCompiles.reload(run.environment.get("arch") or "", journal).record_into(run)
        return run
    except BaseException:
        executor.close()
        raise


def mcp_app(run: Run, run_id: str, settings: ServiceSettings, verifier: RunTokenVerifier) -> Starlette:
    """The run's MCP server as a streamable HTTP app, its path /mcp (the service forwards /runs/{id}/mcp there);
    its bearer check bound to this run's endpoint, and Host/Origin checked as `serve --http` checks them."""
    auth = AuthSettings(issuer_url=settings.base_url, resource_server_url=settings.mcp_url(run_id),
                        required_scopes=[SCOPE], validate_token_resource=True)
    server = build_server(run, token_verifier=verifier, auth=auth)
    return server.streamable_http_app(streamable_http_path="/mcp", host=settings.host,
                                      transport_security=transport_security(settings.host, settings.port))


async def serve_lifespan(live: LiveRun, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Hold the app's lifespan open (its session manager runs in it) until the service stops the run's app."""
    async with live.app.router.lifespan_context(live.app):
        task_status.started()
        await live.stop.wait()
