"""`kernel-referee demo`: a scripted agent drives a real `kernel-referee serve` over stdio on matmul_f32.

The agent's plan is seven candidates written for the demo (server/demo_kernels/, each headed by
what it is): naive, tiled, register-blocked with float4 loads, one with an edge bug, one that does
not compile, and two tile shapes of the register-blocked kernel. Each goes compile_kernel ->
validate -> time_kernel -> record_attempt, which spends the budget of seven; the demo then prints
one line per attempt (verdict, reasons, per-case median, speedup vs the baseline and vs cuBLAS) and
the run folder. Without a GPU it compiles the candidates, shows what NVRTC reports and says that
running them needs a GPU (exit 3, as `check`). The same agent plays an audit service run over the run's
streamable-HTTP endpoint with its agent token (`session_over_http`; bench/service_gpu.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, TextIO, TypeVar

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from harness.device import gpu_absent_reason
from harness.task import load_task
from harness.task_model import TaskError
from harness.worker_side.nvrtc import compile_kernel
from server.demo_table import attempt_line, compile_line, ms_text, render_table, speedup_text
from server.settings import RefereeSettings, sandbox_refusal

KERNELS = Path(__file__).with_name("demo_kernels")
KERNEL_NAME = "matmul_f32"
EXIT_OK, EXIT_FAILED, EXIT_BAD, EXIT_NO_GPU = 0, 1, 2, 3
# Handed to the server when set: the GPU it may use, and where Python finds an uninstalled checkout.
_PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PYTHONPATH")

Say = Callable[[str], None]
T = TypeVar("T")
HTTP_TIMEOUT_S = 120.0  # one tool call over HTTP, beyond the longest a timing or an attempt takes (~45 s)


def _tiles(size: int) -> dict:
    return {"grid": [f"ceil_div(n, {size})", f"ceil_div(m, {size})"], "block": [size, size]}


def _blocked(bm: int, bn: int) -> dict:
    return {"grid": [f"ceil_div(n, {bn})", f"ceil_div(m, {bm})"], "block": [(bm // 8) * (bn // 8)]}


@dataclass(frozen=True)
class Step:
    """One candidate of the scripted agent: a kernel file, its launch and options, and why it is tried."""

    label: str
    file: str
    launch: dict
    options: tuple[str, ...] = ()
    rationale: str = ""

    @property
    def source(self) -> str:
        return (KERNELS / self.file).read_text()


PLAN: tuple[Step, ...] = (
    Step("naive", "naive.cu", _tiles(16), rationale="a first correct kernel: one thread per element, no reuse"),
    Step("tiled 32x32", "tiled.cu", _tiles(32), rationale="shared-memory tiles of 32, four times the baseline's"),
    Step("register-blocked 128x128", "register_blocked.cu", _blocked(128, 128),
         rationale="8x8 outputs per thread in registers, float4 loads: 64 FMAs per 4 shared loads"),
    Step("edge bug (k tail dropped)", "edge_bug.cu", _blocked(128, 128),
         rationale="the register-blocked kernel without the partial last step of k"),
    Step("does not compile", "broken.cu", {"grid": ["ceil_div(n, 64)", "ceil_div(m, 16)"], "block": [16, 16]},
         rationale="four columns per thread with float4 stores"),
    Step("register-blocked 64x128", "register_blocked.cu", _blocked(64, 128), ("-DBM=64",),
         rationale="half-height tiles: twice the blocks for 132 SMs"),
    Step("register-blocked 64x64", "register_blocked.cu", _blocked(64, 64), ("-DBM=64", "-DBN=64"),
         rationale="quarter tiles: four times the blocks, two warps each"),
)


class DemoError(RuntimeError):
    """A tool call the scripted agent cannot go on from (the referee refused it or failed)."""


@dataclass
class Outcome:
    """What the referee answered for one step."""

    step: Step
    compiled: dict
    validated: dict | None = None
    timed: dict | None = None
    not_timed: str | None = None
    attempt: dict | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each tool call


@dataclass
class Session:
    description: dict
    outcomes: list[Outcome]
    summary: dict


# -------------------------------------------------------------------------------- the session

def server_parameters(task_dir: Path, results: Path, *, no_sandbox: bool = False, iterations: int | None = None,
                      warmups: int | None = None, profile: bool = False) -> StdioServerParameters:
    """`kernel-referee serve --task ... --new-run` of this installation: a fresh run, never a resumed one."""
    args = ["serve", "--task", str(task_dir), "--results", str(results), "--new-run"]
    if iterations is not None:
        args += ["--iterations", str(iterations)]
    if warmups is not None:
        args += ["--warmups", str(warmups)]
    if no_sandbox:
        args.append("--no-sandbox")
    if profile:
        args.append("--profile")
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    script = Path(sys.executable).with_name("kernel-referee")  # the console script beside this interpreter
    if script.is_file():
        return StdioServerParameters(command=str(script), args=args, env=env)
    return StdioServerParameters(command=sys.executable, args=["-m", "server.cli", *args], env=env)


async def _call(client: Client, tool: str, arguments: dict, say: Say | None = None, prefix: str = "",
                refusal_ok: bool = False) -> tuple[dict | str, float]:
    """(structured answer, or the refusal's text where `refusal_ok`; seconds the call took)."""
    started = time.perf_counter()
    result = await client.call_tool(tool, arguments, progress_callback=_progress(say, prefix) if say else None)
    seconds = time.perf_counter() - started
    if result.is_error:
        text = result.content[0].text if result.content else "(no message)"
        if refusal_ok:
            return text, seconds
        raise DemoError(f"{tool} refused: {text}")
    return result.structured_content, seconds


async def _until_prepared(client: Client, say: Say, poll_s: float = 1.0, patience_s: float = 900.0) -> dict:
    """describe_task once the new run is prepared: a server answers at once and prepares the run behind (the
    reference's outputs, the baseline's timing), and the tools that need it answer "preparing" until then."""
    waited = 0.0
    while True:
        description, _ = await _call(client, "describe_task", {})
        preparation = description.get("preparation") or {"state": "ready"}
        if preparation["state"] == "ready":
            return description
        if preparation["state"] == "failed":
            raise DemoError(f"the run could not be prepared: {preparation.get('error')}")
        if waited == 0.0:
            say(f"the run is being prepared ({preparation['step']}); waiting")
        if waited >= patience_s:
            raise DemoError(f"the run was still being prepared after {patience_s:.0f} s ({preparation['step']})")
        await anyio.sleep(poll_s)
        waited += poll_s


def _progress(say: Say, prefix: str):
    async def report(progress: float, total: float | None, message: str | None) -> None:
        if message:
            say(f"{prefix}    ... {message}")

    return report


async def drive(client: Client, plan: tuple[Step, ...], say: Say) -> list[Outcome]:
    """Every step through compile -> validate -> time -> record_attempt on a connected client."""
    return [await _step(client, f"[{number}/{len(plan)}] {step.label}", step, say)
            for number, step in enumerate(plan, 1)]


async def _step(client: Client, prefix: str, step: Step, say: Say) -> Outcome:
    arguments = {"source": step.source, "launch": step.launch}
    if step.options:
        arguments["options"] = list(step.options)
    compiled, seconds = await _call(client, "compile_kernel", arguments)
    outcome = Outcome(step, compiled, seconds={"compile_kernel": seconds})
    say(f"{prefix}: compile_kernel: {compile_line(compiled)} ({seconds:.1f} s)")
    candidate = compiled["candidate"]
    if compiled["ok"]:
        outcome.validated, outcome.seconds["validate"] = await _call(client, "validate", {"candidate_id": candidate})
        failed = [f"{r['code']} [{r['case']}]" for c in outcome.validated["cases"] for r in c["reasons"]]
        verdict = "passed" if outcome.validated["passed"] else "FAILED " + ", ".join(failed[:3])
        say(f"{prefix}: validate: {verdict} ({outcome.seconds['validate']:.1f} s)")
    if outcome.validated and outcome.validated["passed"]:
        timed, outcome.seconds["time_kernel"] = await _call(client, "time_kernel", {"candidate_id": candidate}, say,
                                                            prefix, refusal_ok=True)
        if isinstance(timed, str):
            outcome.not_timed = timed
            say(f"{prefix}: time_kernel: {timed}")
        else:
            outcome.timed, s = timed, timed["speedup_vs_baseline"]
            say(f"{prefix}: time_kernel: {timed['score_ms']:.3f} ms (geometric mean), vs baseline {speedup_text(s)} "
                f"({outcome.seconds['time_kernel']:.1f} s)")
    outcome.attempt, outcome.seconds["record_attempt"] = await _call(client, "record_attempt", {
        "candidate_id": candidate, "rationale": step.rationale or step.label,
        "usage": {"model": "kernel-referee demo (scripted)", "calls": len(outcome.seconds) + 1}}, say, prefix)
    say(f"{prefix}: record_attempt: {attempt_line(outcome.attempt)} ({outcome.seconds['record_attempt']:.1f} s)")
    return outcome


async def _profile(client: Client, step: Step, say: Say) -> None:
    """One profile_kernel call on the first candidate, told in one line (or its one-line refusal)."""
    answer, seconds = await _call(client, "profile_kernel", {"source": step.source, "launch": step.launch},
                                  refusal_ok=True)
    say(f"profile_kernel ({step.label}): {answer if isinstance(answer, str) else profile_line(answer)} "
        f"({seconds:.1f} s)")


def profile_line(answer: dict) -> str:
    d = answer["digest"]
    occupancy, stalls = d["occupancy"], d["top_stalls"]
    parts = [f"{ms_text(d['duration_ms'])} ms", f"speed of light compute {_pct(d['sol_compute_pct'])}, memory "
             f"{_pct(d['sol_memory_pct'])}", f"occupancy {_pct(occupancy['achieved_pct'])} of "
             f"{_pct(occupancy['theoretical_pct'])} (limited by {', '.join(occupancy['limited_by']) or '?'})"]
    if stalls:
        parts.append(f"top stall {stalls[0]['reason']} ({stalls[0]['share']:.0%})")
    return "; ".join(parts) + f"; {answer['resource']}"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


async def interruptible(main: Callable[..., Awaitable[T]], *args) -> T:
    """`main(*args)`, ended by Ctrl-C (SIGINT) as a cancel of the scope it runs in, then KeyboardInterrupt.

    asyncio's own Ctrl-C cancels the main task once: a library call that takes that one cancellation for its own
    (a timeout's scope, a stream's cleanup) lets the demo play on, or end as if nothing happened. A cancelled
    anyio scope cancels every await inside it until it is left, so nothing inside can swallow it."""
    interrupted = False
    try:
        async with anyio.create_task_group() as group:
            async def watch(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
                nonlocal interrupted
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    task_status.started()
                    async for _ in signals:
                        interrupted = True
                        group.cancel_scope.cancel()
                        return

            await group.start(watch)  # the signal is ours before `main` starts
            result = await main(*args)
            group.cancel_scope.cancel()
    except BaseException:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    if interrupted:
        raise KeyboardInterrupt
    return result


async def session(params: StdioServerParameters, plan: tuple[Step, ...], say: Say) -> Session:
    async with Client(params, cache=None) as client:  # describe_task is read twice: never from a cache
        return await play(client, plan, say)


async def session_over_http(mcp_url: str, token: str, plan: tuple[Step, ...], say: Say,
                            patience_s: float = 900.0) -> Session:
    """The same session on an audit service run's streamable-HTTP endpoint (`/runs/ID/mcp`), with the run's agent
    token; a run still queued for a GPU is waited for, up to `patience_s`, as one being prepared."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_TIMEOUT_S) as http:
        async with Client(streamable_http_client(mcp_url, http_client=http), cache=None) as client:
            return await play(client, plan, say, patience_s)


async def play(client: Client, plan: tuple[Step, ...], say: Say, patience_s: float = 900.0) -> Session:
    """The scripted agent's whole run on a connected client: the prepared run's task, the plan, its summary."""
    first = await _until_prepared(client, say, patience_s=patience_s)
    left = first["budget"]["attempts_left"]
    if left != len(plan):
        raise DemoError(f"the run has {left} attempts left; the demo plays {len(plan)} (a new run was expected)")
    say(f"describe_task: {first['name']}, cases {', '.join(c['name'] for c in first['cases'])}; "
        f"baseline {ms_text(first.get('baseline_score_ms'))} ms (geometric mean); budget {left} attempts")
    if first.get("profiling"):
        await _profile(client, plan[0], say)
    outcomes = await drive(client, plan, say)
    description, _ = await _call(client, "describe_task", {})
    summary = json.loads((await client.read_resource("referee://summary.json")).contents[0].text)
    return Session(description, outcomes, summary)


# -------------------------------------------------------------------------------- the command

def task_folder() -> Path | None:
    """cases/matmul_f32 of this checkout (an editable install), else under the working directory."""
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "cases" / "matmul_f32" / "task.toml").is_file():
            return root / "cases" / "matmul_f32"
    return None


def _unsuited(task_dir: Path) -> str | None:
    """Why the demo's candidates cannot play this task (they are matmul_f32 kernels), or None."""
    try:
        task = load_task(task_dir)
    except (TaskError, OSError) as exc:
        return f"{task_dir} is not a task folder: {exc}"
    shipped = task_folder()
    signature = load_task(shipped).signature if shipped else task.signature
    if task.kernel_name != KERNEL_NAME or " ".join(task.signature.split()) != " ".join(signature.split()):
        return f"the demo's candidates are {KERNEL_NAME} kernels; {task_dir} asks for `{task.signature}`"
    return None


def compile_only(plan: tuple[Step, ...], arch: str, out: TextIO) -> None:
    """The no-GPU path: NVRTC compiles every candidate (the demo's own, trusted files: no worker needed)."""
    for number, step in enumerate(plan, 1):
        result = compile_kernel(step.source, KERNEL_NAME, options=step.options, arch=arch)
        options = f" {' '.join(step.options)}" if step.options else ""
        print(f"[{number}/{len(plan)}] {step.label} ({step.file}{options}): "
              f"{compile_line(_compile_answer(result))}", file=out)
        if not result.ok:
            print("\n".join(f"    {line}".rstrip() for line in result.log.strip().splitlines()), file=out)


def _compile_answer(result) -> dict:
    """A CompileResult in the shape of compile_kernel's answer, so both paths print alike."""
    r = result.resources
    return {"ok": result.ok, "compile_ms": result.compile_ms, "resources": None if r is None else {
        "registers": r.registers, "spill_bytes": r.spill_store_bytes + r.spill_load_bytes,
        "shared_bytes": r.shared_bytes, "stack_bytes": r.stack_bytes}}


def _innermost(exc: BaseException) -> BaseException:
    """The first error inside the task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def run_demo(settings: RefereeSettings, out: TextIO, task: Path | None = None) -> int:
    """Play the demo's run against `kernel-referee serve` with `settings` (on `task`, default matmul_f32)."""
    from anyio import run as anyio_run  # anyio loads only for a demo that plays

    task_dir = task or task_folder()
    if task_dir is None:
        print("kernel-referee demo: cases/matmul_f32 was not found (run it from the repository root)", file=sys.stderr)
        return EXIT_BAD
    refused = _unsuited(Path(task_dir))
    if refused:
        print(f"kernel-referee demo: {refused}", file=sys.stderr)
        return EXIT_BAD
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"kernel-referee demo: the scripted agent's {len(PLAN)} candidates for {task_dir.name}, compiled with "
              "NVRTC for sm_90 (the H200's architecture):", file=out)
        compile_only(PLAN, "sm_90", out)
        print(f"\nNo GPU: {absent}.\nRunning, checking and timing them (and serving the run) need an NVIDIA GPU; "
              "on a GPU machine this command plays the whole run.", file=out)
        return EXIT_NO_GPU
    refusal = sandbox_refusal(settings.confine)
    if refusal:
        print(f"kernel-referee: {refusal}", file=sys.stderr)
        return EXIT_BAD

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    say(f"starting `kernel-referee serve --task {task_dir} --results {settings.results} --new-run`; it computes the "
        "reference outputs and times the baseline first (its log follows on stderr)")
    timing = settings.run.timing
    params = server_parameters(task_dir, settings.results, no_sandbox=not settings.confine,
                               iterations=timing.iterations, warmups=timing.warmups, profile=settings.run.profile)
    try:
        result = anyio_run(interruptible, session, params, PLAN, say)
    except Exception as exc:  # noqa: BLE001 - a refusal, or the server stopped or never started
        error = _innermost(exc)
        why = str(error) if isinstance(error, DemoError) else (
            f"the session with the server ended early ({type(error).__name__}: {error}); see the server's "
            "messages above")
        print(f"kernel-referee demo: {why}", file=sys.stderr)
        return EXIT_FAILED
    run_dir = (Path(settings.results) / result.summary["run"]).resolve()
    print("", file=out)
    print(render_table(result.description, [(o.step.label, o.attempt) for o in result.outcomes], result.summary),
          file=out)
    print(f"\nrun folder: {run_dir}\n(check its audit log with: kernel-referee verify {run_dir})", file=out)
    return EXIT_OK
