"""The MCP layer: tools, resources and a prompt over one Run. Thin: check, call one function, map errors."""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Annotated, Any, AsyncIterator, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.types import Completion, CompletionArgument, ResourceTemplateReference, ToolAnnotations
from pydantic import Field

from harness.worker_side.compile_policy import MAX_SOURCE_BYTES
from server import attempt, preparation, probes, profiling, resource_views
from server.call_gate import FinishedReports, gate, strict_arguments
from server.client_log import ClientLog
from server.models import (AttemptAnswer, CheckAnswer, CompileAnswer, FinishAnswer, LaunchInput, ProfileAnswer,
                           TaskDescription, TimeAnswer, Usage)
from server.resource_updates import ResourceUpdates
from server.run import Run

INSTRUCTIONS = """kernel-referee judges one CUDA kernel. Read describe_task, write a kernel with the exact
signature, compile_kernel it, check it with run_cases / validate, measure it with time_kernel, and spend one
of the limited attempts with record_attempt only when you believe it is correct and faster. Probes are free
but limited per attempt window; attempts are final. Hidden inputs and hidden shapes decide at the end."""

SOURCE_TEXT = "CUDA C++ source defining the kernel with the task's exact signature"
Source = Annotated[str | None, Field(description=f"{SOURCE_TEXT}; compiled first, which counts against the compile "
                                     "rate limit (or give `candidate_id`)", max_length=MAX_SOURCE_BYTES)]
CandidateId = Annotated[str | None, Field(description="an id returned by compile_kernel", max_length=64)]
Launch = Annotated[LaunchInput | None, Field(description="launch geometry; default: the candidate's or the task's")]
Cases = Annotated[list[Annotated[str, Field(max_length=100)]] | None,
                  Field(description="case names, each run once (a repeated name is ignored; default: all)",
                        max_length=64)]
Options = Annotated[list[Annotated[str, Field(max_length=200)]] | None,
                    Field(description="NVRTC options from the allow-list, e.g. -maxrregcount=64, --use_fast_math",
                          max_length=32)]
Rationale = Annotated[str, Field(description="why this candidate should be correct and faster (kept in the history)",
                                 min_length=1, max_length=4000)]
UsageInput = Annotated[Usage | None, Field(description="what the client spent on this attempt (tokens, calls, cost), "
                                           "kept in the audit log; plain values, at most 4096 bytes as JSON")]
Reason = Annotated[str, Field(description="why the run ends now (kept in the summary)", min_length=1,
                              max_length=1000)]

# What each tool does to the run, as the client is told: describe_task reads; compile_kernel and the probes are
# charged on every call (the compile rate limit, the probe window), so calling one again is not the same as once;
# record_attempt and finish spend what cannot be given back.
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHARGED = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
SPENDS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
_CANDIDATE_ID = re.compile(r"c[0-9a-f]{15}")
COMPILE_LOGS = "referee://compile-logs/{candidate}"
MAX_COMPLETIONS = 100  # the most values a completion answer may carry


def build_server(run: Run, **server_options: Any) -> MCPServer:
    reports, logs, bus = FinishedReports(run), ClientLog(), InMemorySubscriptionBus()
    updates = ResourceUpdates(lambda: run.dir, bus)

    @asynccontextmanager
    async def lifespan(mcp_server: MCPServer) -> AsyncIterator[dict]:
        async with reports.lifespan(mcp_server) as state, updates.watching():
            yield state

    server = MCPServer(name="kernel-referee", version=_version(), instructions=INSTRUCTIONS, lifespan=lifespan,
                       subscriptions=bus, **server_options)
    logs.install(server)
    call = gate(run, reports, logs)

    def candidate(candidate_id, source, options=None, launch=None):
        return run.candidate(candidate_id, source, options, _launch_fields(launch))

    _probe_tools(server, run, call, candidate)
    _profile_tool(server, run, call, candidate)
    _attempt_tools(server, run, call, candidate)
    _resources(server, run)
    _completions(server, run)
    _prompt(server)
    strict_arguments(server)  # every tool refuses an argument it does not take
    return server


def _launch_fields(launch: LaunchInput | None) -> dict | None:
    return launch.model_dump(mode="json", exclude_defaults=True) if launch else None


def _version() -> str:
    try:
        return metadata.version("kernel-referee")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _tool(server: MCPServer, title: str, annotations: ToolAnnotations) -> Callable:
    """server.tool with a title, and the docstring as one plain paragraph (no source indentation on the wire)."""
    def register(fn: Callable) -> Callable:
        return server.tool(title=title, description=" ".join((fn.__doc__ or "").split()), annotations=annotations)(fn)
    return register


def _probe_tools(server: MCPServer, run: Run, call: Callable, candidate: Callable) -> None:
    @_tool(server, "Describe the task", READS)
    async def describe_task() -> TaskDescription:
        """The task: signature, parameters, visible cases, tolerances, default launch, the device, the baseline's
        latency per case, the best so far, and the budget. Start here."""
        return await call(None, "describe_task", {}, lambda _: preparation.described(run), needs_budget=False)

    @_tool(server, "Compile a kernel", CHARGED)
    async def compile_kernel(source: Annotated[str, Field(description=SOURCE_TEXT, max_length=MAX_SOURCE_BYTES)],
                             options: Options = None, launch: Launch = None) -> CompileAnswer:
        """Compile a kernel with NVRTC for the run's GPU. Returns a candidate id (source + options + launch) to
        pass as `candidate_id` to the other tools, the trimmed compiler log, registers, spills and shared memory.
        Free, rate-limited; it answers while the run is queued for a GPU too (the other tools wait for one)."""
        args = {"source_bytes": len(source.encode()), "options": options}
        return await call(None, "compile_kernel", args,
                          lambda _: probes.compile_candidate(run, lambda: candidate(None, source, options, launch)),
                          early=lambda compiles: compiles.compile(run, source, options, _launch_fields(launch)))

    @_tool(server, "Run chosen cases", CHARGED)
    async def run_cases(ctx: Context, candidate_id: CandidateId = None, source: Source = None, launch: Launch = None,
                        cases: Cases = None) -> CheckAnswer:
        """Run a candidate once per chosen visible case and compare with the reference: pass/fail and a mismatch
        digest per case. A probe: costs no attempt, limited per attempt window."""
        return await call(ctx, "run_cases", {"candidate": candidate_id, "cases": cases}, lambda report: (
            probes.check_cases(run, "run_cases", lambda: candidate(candidate_id, source, None, launch), cases, report)))

    @_tool(server, "Validate a candidate", CHARGED)
    async def validate(ctx: Context, candidate_id: CandidateId = None, source: Source = None,
                       launch: Launch = None) -> CheckAnswer:
        """The full correctness protocol on every visible case: two runs with different poison, guard bands,
        input integrity. A probe."""
        return await call(ctx, "validate", {"candidate": candidate_id}, lambda report: probes.check_cases(
            run, "validate", lambda: candidate(candidate_id, source, None, launch), None, report))

    @_tool(server, "Time a candidate", CHARGED)
    async def time_kernel(ctx: Context, candidate_id: CandidateId = None, source: Source = None,
                          launch: Launch = None, cases: Cases = None) -> TimeAnswer:
        """Time a valid candidate on the performance cases beside the baseline and the best (median with
        interval, GB/s, TFLOP/s, speedups). Refuses a candidate that fails validation. A probe."""
        return await call(ctx, "time_kernel", {"candidate": candidate_id, "cases": cases},
                          lambda report: probes.time_candidate(run, lambda: candidate(candidate_id, source, None, launch),
                                                               cases, report))


def _profile_tool(server: MCPServer, run: Run, call: Callable, candidate: Callable) -> None:
    @_tool(server, "Profile a candidate (Nsight Compute)", CHARGED)
    async def profile_kernel(ctx: Context, candidate_id: CandidateId = None, source: Source = None,
                             launch: Launch = None,
                             case: Annotated[str | None, Field(description="a performance case (default: the first)",
                                                               max_length=100)] = None) -> ProfileAnswer:
        """Profile one launch of a valid candidate on one performance case with Nsight Compute: duration, speed of
        light, DRAM/L2/L1 throughput and hit rates, occupancy and its limiter, top warp stalls, FMA and tensor
        pipes, FLOP/s, bank conflicts, sectors per global request, the roofline point. The full report is
        referee://profiles/{id}. A probe with its own GPU-time cap; only when the run was served with --profile
        (describe_task says). Never part of a verdict."""
        return await call(ctx, "profile_kernel", {"candidate": candidate_id, "case": case},
                          lambda report: profiling.profile_candidate(
                              run, lambda: candidate(candidate_id, source, None, launch), case, report))


def _attempt_tools(server: MCPServer, run: Run, call: Callable, candidate: Callable) -> None:
    # Destructive: an attempt cannot be taken back, and the last one ends the run.
    @_tool(server, "Record an attempt (spends one)", SPENDS)
    async def record_attempt(ctx: Context, rationale: Rationale, candidate_id: CandidateId = None,
                             source: Source = None, launch: Launch = None, usage: UsageInput = None) -> AttemptAnswer:
        """Spend one attempt, irreversibly (the budget is fixed and cannot be reset; the last attempt ends the run):
        full validation on the visible cases and on fresh secret inputs, timing side by side with the best and the
        baseline, a verdict with reasons. Once the attempt has begun, a cancelled call or a source that does not
        compile still spends it (recorded as rejected). The call answers within 55 s: a launch more than 20 times
        slower than the baseline's (at least 1 s) is stopped and rejected as too_slow. Use it only for a candidate
        you believe is correct and faster."""
        usage_data = usage.model_dump(mode="json", exclude_none=True) if usage else None
        return await call(ctx, "record_attempt", {"candidate": candidate_id, "rationale": rationale},
                          lambda report: attempt.record_attempt(run, candidate(candidate_id, source, None, launch),
                                                                rationale, usage_data, report))

    @_tool(server, "Finish the run", SPENDS)
    async def finish(ctx: Context, reason: Reason) -> FinishAnswer:
        """End the run now (remaining attempts are forfeited). The best is then checked on hidden holdout
        cases; the summary says what counted."""
        return await call(ctx, "finish", {"reason": reason},
                          lambda report: attempt.finish(run, f"agent finished: {reason}", report))


def _resources(server: MCPServer, run: Run) -> None:
    def read(name: str) -> str:
        with run.folder_moving():  # a new run's folder moves into place once prepared
            path = run.dir / name
            if not path.exists():
                raise ResourceNotFoundError(f"{name} does not exist yet")
            return path.read_text()

    @server.resource("referee://task", mime_type="application/json",
                     description="the task as describe_task gives it (the holdout cases are never shown)")
    def task_resource() -> str:
        return preparation.described(run).model_dump_json(indent=2)

    @server.resource("referee://device", mime_type="application/json",
                     description="the GPU's facts: limits per SM and block, measured peaks, launch floor, NVRTC")
    def device_resource() -> str:
        if preparation.of(run) is not None:
            raise ResourceNotFoundError("the run is being prepared; describe_task says how long it has left")
        return probes.device(run).model_dump_json(indent=2)

    @server.resource(COMPILE_LOGS, mime_type="text/plain", description="a full compiler log")
    def compile_log(candidate: str) -> str:
        if not _CANDIDATE_ID.fullmatch(candidate):
            raise ResourceNotFoundError("candidate ids look like c0123456789abcde")
        compiles = preparation.early_compiles(run)  # a run waiting for its GPU keeps its compile logs in memory
        early_log = compiles.log(candidate) if compiles is not None else None
        return early_log if early_log is not None else read(f"compile-logs/{candidate}.log")

    @server.resource(profiling.PROFILES, mime_type="text/csv",
                     description="a full Nsight Compute report of profile_kernel (ncu's raw page as CSV)")
    def profile_report(profile: str) -> str:
        if not profiling.PROFILE_ID.fullmatch(profile):
            raise ResourceNotFoundError("profile ids look like p001")
        return read(profiling.profile_path(profile))

    _record_resources(server, run, read)


def _record_resources(server: MCPServer, run: Run, read: Callable[[str], str]) -> None:
    """The run's records: history (whole and compact), summary, best, the audit log in pages, the report."""
    @server.resource("referee://history.json", mime_type="application/json",
                     description="every attempt, with every raw timing sample (large: see history-compact.json)")
    def history_resource() -> str:
        return read("history.json")

    @server.resource("referee://history-compact.json", mime_type="application/json",
                     description="every attempt without raw timing samples or compiler logs; `full` names the rest")
    def compact_history_resource() -> str:
        read("history.json")  # not found until the baseline is recorded
        with run.folder_moving():
            return json.dumps(resource_views.compact_history(run.dir), indent=1)

    @server.resource(resource_views.EVENTS_URI + "{?cursor}", mime_type="application/json",
                     description="the audit log, 200 records a page from `cursor` (a record's line number); `next` "
                                 "is the following page's URI")
    def events_resource(cursor: str = "0") -> str:
        try:
            with run.folder_moving():
                return json.dumps(resource_views.events_page(run.dir, cursor))
        except resource_views.NoSuchPage as exc:
            raise ResourceNotFoundError(str(exc)) from None

    @server.resource("referee://report.html", mime_type="text/html",
                     description="the run's report, written when the run finishes (or by `kernel-referee report`)")
    def report_resource() -> str:
        return read("report.html")

    @server.resource("referee://summary.json", mime_type="application/json", description="the run so far")
    def summary_resource() -> str:
        return read("summary.json")

    @server.resource("referee://best.cu", mime_type="text/x-cuda", description="the best valid kernel")
    def best_resource() -> str:
        return read("best.cu")


def _completions(server: MCPServer, run: Run) -> None:
    @server.completion()
    async def complete(ref: Any, argument: CompletionArgument, _context: Any) -> Completion | None:
        """Candidate ids for the compile-log template: those of the run with a log, prefix-matched."""
        if not isinstance(ref, ResourceTemplateReference) or (ref.uri, argument.name) != (COMPILE_LOGS, "candidate"):
            return None
        ids = sorted(cid for cid in list(run.candidates) if cid.startswith(argument.value)
                     and (run.dir / "compile-logs" / f"{cid}.log").exists())
        return Completion(values=ids[:MAX_COMPLETIONS], total=len(ids), has_more=len(ids) > MAX_COMPLETIONS)


def _prompt(server: MCPServer) -> None:
    @server.prompt()
    def optimize_kernel() -> str:
        """How to optimize the task's kernel with this referee."""
        return (
            "You are optimizing one CUDA kernel under a referee.\n"
            "1. Call describe_task: note the signature (keep it exact), the tolerances, the visible cases, the "
            "baseline's latency and the device's figures.\n"
            "2. Write a candidate. compile_kernel it and read registers, spills and shared memory.\n"
            "3. Probe for free (within the window's limit): run_cases on a few cases, then validate.\n"
            "4. time_kernel to see the speedup against the baseline and the best, with intervals.\n"
            "5. Only when validate passes and time_kernel shows a gain beyond noise, call record_attempt with a "
            "short rationale. Attempts are limited and final; they are checked on fresh secret inputs.\n"
            "6. Stop with finish when you cannot improve. The best is then checked on hidden shapes: handle every "
            "shape correctly, not only the visible ones.")
