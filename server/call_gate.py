"""How every tool call runs: through the gate (calls that change the run one at a time, read-only ones beside
them), in a thread, within the call's deadline, with its progress forwarded and its refusals and storage
failures turned into tool errors; and the report of a run that finished, written after the call answered."""

from __future__ import annotations

import errno
import logging
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.abc
import anyio.from_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from harness.oracle import OracleError
from harness.settings import ReferenceFailed
from harness.worker_side.compile_policy import CompileRefused
from sandbox.deadline import Deadline
from server import preparation, probes
from server.call import CallProgress
from server.client_log import ClientLog
from server.lease_waits import resume_waits
from server.report_files import write_end_report
from server.run import Refusal, Run

log = logging.getLogger(__name__)
# A full or failing disk under the results folder: told to the agent, not hidden as a crash.
_STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


class FinishedReports:
    """A run that finished during a call gets its report (HTML, heatmaps) written after the call answered, in
    the background of the server's lifespan; the lifespan's end waits for it."""

    def __init__(self, run: Run):
        self.run = run
        self.group: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def lifespan(self, _server: MCPServer) -> AsyncIterator[dict]:
        async with anyio.create_task_group() as group:
            self.group = group
            try:
                yield {}
            finally:
                self.group = None

    async def after(self, was_finished: bool) -> None:
        if was_finished or not self.run.finished:
            return
        if self.group is None:  # no lifespan around this call: write it now
            await anyio.to_thread.run_sync(self._write)
        else:
            self.group.start_soon(anyio.to_thread.run_sync, self._write)

    def _write(self) -> None:
        write_end_report(self.run)


# Calls that change nothing: they answer what the last call that changed the run published, without the gate.
_READ_ONLY = frozenset({"describe_task"})
# Calls a cancel does not stop: the attempt is spent either way, so it runs to its verdict, which is recorded.
_RUN_TO_THE_END = frozenset({"record_attempt", "finish"})


def gate(run: Run, reports: FinishedReports, logs: ClientLog) -> Callable:
    """Every tool's call, in a thread, guarded by the run, with its refusals and storage failures turned into tool
    errors. Calls that change the run go one at a time (the run, its workers and its budget are not shared); a
    read-only call waits for none of them. A cancelled call's thread is waited for before the gate opens again."""
    gate = anyio.Lock()
    if preparation.of(run) is None:
        probes.publish(run)  # no call is in flight yet (a run still prepared is published when ready)

    async def call(ctx: Context | None, tool: str, arguments: dict, work: Callable, *, needs_budget=True,
                   early: Callable | None = None):
        if tool in _READ_ONLY:
            return await _answered(tool, lambda: _read_only(run, tool, arguments, work))
        compiles = preparation.early_compiles(run) if early is not None else None
        if compiles is not None:  # a run waiting for its GPU answers what needs none, nothing logged or spent
            async with gate:
                return await _answered(tool, lambda: _to_thread_settled(lambda: early(compiles), run.executor.abort))
        deadline = Deadline(run.call_deadline_s)  # the whole call's, waiting for the gate included
        # A run still being prepared: a short wait, else refused with nothing logged, charged or spent
        await _answered(tool, lambda: preparation.until_prepared(run, deadline, _told(ctx, logs)))
        async with gate:
            report = CallProgress(_progress_bridge(ctx, logs))
            was_finished = run.finished

            def in_thread():
                with run.exclusive(), run.within(deadline):
                    try:
                        run.guard(tool, arguments, needs_budget=needs_budget)
                        try:
                            return work(report)
                        finally:
                            report.finish("answered")
                    finally:
                        probes.publish(run)

            stop = (lambda: None) if tool in _RUN_TO_THE_END else run.executor.abort
            # An abort stays until resumed, as it may land before the wait it gives up begins: the previous call's
            # abort is spent now that its thread has ended, and this call's own comes only once its thread starts.
            resume_waits(run.executor)
            try:
                return await _answered(tool, lambda: _to_thread_settled(in_thread, stop))
            finally:
                await reports.after(was_finished)

    return call


async def _read_only(run: Run, tool: str, arguments: dict, work: Callable):
    def in_thread():
        if preparation.of(run) is None:  # a run still prepared has no lock to check yet, nor a log to add to
            run.guard(tool, arguments, needs_budget=False)  # logged and tamper-checked; no mutex needed
        return work(None)

    return await anyio.to_thread.run_sync(in_thread)


async def _to_thread_settled(work: Callable, stop: Callable[[], None]):
    """work() in a worker thread, awaited to its end even when this call is cancelled: `stop` is called at once
    (it may end the work early), and the cancellation goes on once the thread has returned. Nothing is left
    running behind a cancelled call, so the run is settled when the server stops."""
    outcome: dict = {}
    done = anyio.Event()

    async def settle() -> None:
        with anyio.CancelScope(shield=True):
            try:
                outcome["value"] = await anyio.to_thread.run_sync(work)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's task
                outcome["error"] = exc
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(settle)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            stop()
            raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _answered(tool: str, answer: Callable):
    """The call's answer, with the run's refusals and a failing disk turned into tool errors."""
    try:
        return await answer()
    except (Refusal, CompileRefused) as exc:
        raise ToolError(str(exc)) from None
    except (ReferenceFailed, OracleError) as exc:
        log.error("%s: %s", tool, exc)  # one line: the task is broken, not the referee
        raise ToolError(f"{exc}. The task's own code failed, not the kernel you sent: the operator must fix the "
                        "task. An attempt whose slot was claimed stays counted (rejected as interrupted; "
                        "referee://history.json has it).") from None
    except OSError as exc:
        if exc.errno not in _STORAGE_ERRORS:
            raise
        log.error("%s: the run folder could not be written", tool, exc_info=True)
        raise ToolError(f"the referee could not write its results folder ({os.strerror(exc.errno)}); "
                        "this call did not complete. An attempt whose slot was claimed stays counted "
                        "(describe_task shows the budget, referee://history.json the verdict); the operator "
                        "must free space before the run can go on.") from None


def _told(ctx: Context | None, logs: ClientLog):
    """Progress sent from the call's own task (not a worker thread), best effort, as `_progress_bridge`'s."""
    if ctx is None:
        return None

    async def tell(done: float, total: float, message: str) -> None:
        try:
            await ctx.report_progress(done, total, message)
            await logs.send(ctx, message)
        except Exception:  # noqa: BLE001 - progress is informative; a closed stream must not fail the call
            log.debug("progress not delivered", exc_info=True)

    return tell


def _progress_bridge(ctx: Context | None, logs: ClientLog):
    """A callback usable from the worker thread that forwards progress to the client, best effort: as a progress
    notification, and as a log message where the client asked for them (logging/setLevel)."""
    if ctx is None:
        return None

    async def tell(done: float, total: float, message: str) -> None:
        await ctx.report_progress(done, total, message)
        await logs.send(ctx, message)

    def report(done: float, total: float, message: str) -> None:
        try:
            anyio.from_thread.run(tell, done, total, message)
        except Exception:  # noqa: BLE001 - progress is informative; a closed stream must not fail the call
            log.debug("progress not delivered", exc_info=True)

    return report


def strict_arguments(server: MCPServer) -> None:
    """Every tool refuses an argument it does not take, naming the ones it does, before the call reaches the gate
    (nothing is charged): `run_cases(case=[...])` would otherwise run every case, `compile_kernel(option=[...])`
    compile without the option. The input schemas say so too (`additionalProperties: false`).

    The SDK builds each tool's argument model from its signature and drops unknown keys; the models are swapped
    here, once all tools are registered (the SDK has no option for it)."""
    for tool in server._tool_manager.list_tools():  # noqa: SLF001 - the registered tools, see above
        tool.fn_metadata.arg_model = _strict_model(tool.name, tool.fn_metadata.arg_model)
        tool.parameters["additionalProperties"] = False


def _strict_model(tool: str, model: type[BaseModel]) -> type[BaseModel]:
    known = [field.alias or name for name, field in model.model_fields.items()]

    def known_only(cls, data: Any) -> Any:
        unknown = sorted(key for key in data if key not in known) if isinstance(data, dict) else []
        if unknown:
            takes = ", ".join(known) if known else "no arguments"
            raise PydanticCustomError("unknown_argument", "unknown argument {unknown}: {tool} takes {takes}",
                                      {"unknown": ", ".join(repr(key[:100]) for key in unknown[:8]), "tool": tool,
                                       "takes": takes})
        return data

    return type(model.__name__, (model,), {"__module__": model.__module__, "model_config": ConfigDict(extra="forbid"),
                                           "known_only": model_validator(mode="before")(classmethod(known_only))})
