"""What a tool call costs the server itself, on a CPU: the per-call guard (the call's audit record, fsynced,
and the tamper check of the run's locked files; `audit_record` alone shows the first part), and how long
describe_task answers when many come at once, or while a slow record_attempt is in flight. The GPU side is the test suite's fake executor (tests/fake_executor.py);
the run is a real run folder of cases/matmul_f32, whose expected outputs take about 111 MB.

With --record-attempt, on a GPU: record_attempt on matmul_f32 (the tiled candidate against the baseline, two
rounds; bench/timing.py's overhead step) against its bound, compile + 1.3 x GPU busy + 0.3 s, with the three
numbers, and each case's bound on a kernel wrong on most timed launches passing every audit (harness/audit_bound.py).

    python bench/call_cost.py [--calls 50] [--concurrent 200] [--slow-s 3] [--record-attempt] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import Bench  # noqa: E402
from harness.device import gpu_absent_reason  # noqa: E402
from harness.task import load_task  # noqa: E402
from server.app import build_server  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.records import EventKind  # noqa: E402
from server.run import Run, RunSettings  # noqa: E402
from tests.fake_executor import FakeExecutor  # noqa: E402

MATMUL = ROOT / "cases" / "matmul_f32"
# Files written less than this long ago are hashed on every call (their stat identity is not yet
# trusted): the steady state of a run is measured after it.
SETTLE_S = 2.5


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def timed_ms(step, calls: int) -> dict:
    """`step()` `calls` times: median and max in milliseconds."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3)}


def guard_ms(run: Run, tool: str, calls: int) -> dict:
    """Run.guard as the gate calls it: the call's audit record, then the tamper check."""
    def guard() -> None:
        with run.exclusive():
            run.guard(tool, {}, needs_budget=False)

    return timed_ms(guard, calls)


async def concurrent_describes(run: Run, count: int) -> dict:
    """`count` describe_task calls issued at once through one MCP client: wall time and per-call latency."""
    latencies = []

    async def one(c: Client) -> None:
        started = time.perf_counter()
        result = await c.call_tool("describe_task", {})
        assert not result.is_error, result.content[0].text
        latencies.append(time.perf_counter() - started)

    async with Client(build_server(run), cache=None) as c:
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(count):
                group.start_soon(one, c)
        wall = time.perf_counter() - started
    return {"calls": count, "wall_s": round(wall, 3), "median_s": round(statistics.median(latencies), 3),
            "max_s": round(max(latencies), 3)}


async def describe_during_attempt(run: Run, slow_s: float) -> dict:
    """describe_task issued while a record_attempt whose timing takes `slow_s` seconds is in flight."""
    source = (MATMUL / "initial.cu").read_text() + f"\n// fake: slow_s={slow_s}\n"
    answered = {}

    async def attempt(c: Client) -> None:
        started = time.perf_counter()
        await c.call_tool("record_attempt", {"source": source, "rationale": "slow"})
        answered["record_attempt_s"] = round(time.perf_counter() - started, 3)

    async with Client(build_server(run), cache=None) as c:
        async with anyio.create_task_group() as group:
            group.start_soon(attempt, c)
            await anyio.sleep(min(1.0, slow_s / 3))  # the attempt is compiled and being timed by now
            started = time.perf_counter()
            result = await c.call_tool("describe_task", {})
            assert not result.is_error, result.content[0].text
            answered["describe_task_s"] = round(time.perf_counter() - started, 3)
    return answered


def record_attempt_cost() -> dict:
    """record_attempt's wall time on a GPU against compile + 1.3 x GPU busy + 0.3 s, and its audits' bound."""
    with tempfile.TemporaryDirectory(prefix="call-cost-gpu-") as out:
        bench = Bench(Path(out), runs=1, trials=1)
        try:
            bench.overhead()
        finally:
            bench.close()
    o = bench.results["overhead"]
    jobs = o["worker_jobs"]["each"]
    return {"record_attempt_s": round(o["record_attempt_wall_s"], 3), "compile_s": round(o["compile_s"], 3),
            "gpu_busy_s": round(o["gpu_busy_s"], 3), "gpu_busy_source": o["gpu_busy_source"],
            "bound_s": round(o["bound_s"], 3), "within_bound": o["record_attempt_wall_s"] <= o["bound_s"],
            "audit_escape_bound": o["audit_escape_bound"], "verdict": o["verdict"],
            # where the rest went: the worker jobs' phases, summed, and the executor's calls (bench/timing.py)
            "host_s": round(o["host_s"], 3), "worker_jobs": len(jobs), "worker_phases_s": summed_phases(jobs),
            "executor_calls": o["executor_calls"]}


def summed_phases(jobs: list[dict]) -> dict[str, float]:
    """Each phase's seconds over every worker job that reports phases (the timed loop's: setup, upload, read_back,
    evidence, hash_outputs, ...), in the order they first appear."""
    total: dict[str, float] = {}
    for job in jobs:
        for phase, seconds in (job.get("phases_s") or {}).items():
            total[phase] = round(total.get(phase, 0.0) + seconds, 4)
    return total


def attempt_lines(cost: dict) -> list[str]:
    """The GPU numbers in words: the three terms of the bound, the wall time against it, the audits' bound."""
    lines = [f"record_attempt {cost['record_attempt_s']:.2f} s against compile {cost['compile_s']:.2f} s + 1.3 x "
             f"GPU busy {cost['gpu_busy_s']:.2f} s ({cost['gpu_busy_source']}) + 0.3 s = {cost['bound_s']:.2f} s: "
             + ("within" if cost["within_bound"] else "over")]
    if "host_s" in cost:
        phases = ", ".join(f"{phase} {seconds:.3f} s" for phase, seconds in cost["worker_phases_s"].items())
        calls = ", ".join(f"{name} {c['wall_s']:.3f} s ({c['calls']})" for name, c in cost["executor_calls"].items())
        lines.append(f"  host {cost['host_s']:.2f} s beyond compile and GPU busy; the {cost['worker_jobs']} worker jobs' "
                     f"phases: {phases or 'none reported'}; the executor's calls: {calls}")
    for case, bound in cost["audit_escape_bound"].items():
        lines.append(f"  {case}: a kernel wrong on most timed launches passes every audit with a chance of at most "
                     + ("(not audited)" if bound is None else f"{bound:.3g}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="guard calls timed one after another")
    parser.add_argument("--concurrent", type=int, default=200, help="describe_task calls issued at once")
    parser.add_argument("--slow-s", type=float, default=3.0, help="the slow record_attempt's timing, seconds")
    parser.add_argument("--json", type=Path, help="write the numbers here as JSON")
    parser.add_argument("--record-attempt", action="store_true",
                        help="on a GPU: record_attempt's wall time against compile + 1.3 x GPU busy + 0.3 s")
    args = parser.parse_args(argv)
    if args.record_attempt and (reason := gpu_absent_reason()) is not None:
        print(f"--record-attempt measures on a GPU, and there is none here: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="call-cost-") as tmp:
        run = new_run(MATMUL, Path(tmp) / "results", RunSettings(), FakeExecutor(load_task(MATMUL)))
        time.sleep(SETTLE_S)
        numbers = {"expected_bytes": folder_bytes(run.dir / "expected"),
                   "audit_record": timed_ms(lambda: run.audit.append(EventKind.CALL, {"tool": "bench"}), args.calls),
                   "guard_describe_task": guard_ms(run, "describe_task", args.calls),
                   "guard_record_attempt": guard_ms(run, "record_attempt", max(3, args.calls // 10)),
                   "concurrent_describe_task": anyio.run(concurrent_describes, run, args.concurrent),
                   "describe_during_slow_attempt": anyio.run(describe_during_attempt, run, args.slow_s)}
        run.close()
    if args.record_attempt:
        numbers["record_attempt_on_gpu"] = record_attempt_cost()
    print(json.dumps(numbers, indent=2))
    if args.record_attempt:
        print("\n".join(attempt_lines(numbers["record_attempt_on_gpu"])))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
