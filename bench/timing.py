"""How good the referee's timing is, measured on a GPU: fidelity, repeatability, discrimination
and overhead. Prints tables and writes timing.json (docs/timing.md explains each number).

    python bench/timing.py [--out DIR] [--runs 5] [--trials 20] [--no-ncu] [--ncu-passes 1] [--no-triton]

- fidelity: the referee's median against Nsight Compute's gpu__time_duration (`ncu
  --clock-control none --cache-control all`) and triton.testing.do_bench's median, where installed;
  with --ncu-passes N, ncu's step N times, its own spread shown and its medians' median compared;
- repeatability: coefficient of variation of the median over independent runs (each in a new worker);
- discrimination: matmul_f32's baseline against a copy made about 2% slower by extra work, in
  paired trials timed side by side like record_attempt does; and the same kernel against itself (A/A);
- overhead: record_attempt's wall time against its compile time plus the GPU time of its launches;
  a worker's cold start; a compile-cache hit;
- protocols: the same kernels timed on fresh inputs drawn for every launch (the referee's protocol) and
  on the four rotated fixed input sets (the protocol before it), alternately: the ratio of their
  medians, and what fresh inputs cost per launch in GPU busy time and in wall time.

Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.direct import REPEATS, SETS  # noqa: E402
from bench.overhead_clocks import gpu_busy_counted, wall_clocked  # noqa: E402
from bench.timing_report import median_or_none, ncu_combined, ncu_durations_ms, ncu_summary, protocol_summary, report  # noqa: E402,E501
from harness.device import gpu_absent_reason  # noqa: E402
from harness.gpus import Placement, list_gpus, placement_for  # noqa: E402
from harness.settings import CompiledKernel, TimingSettings  # noqa: E402
from harness.stats import speedup, summarize  # noqa: E402
from harness.task_model import Case  # noqa: E402
from harness.task import load_task  # noqa: E402
from harness.side_by_side import time_side_by_side  # noqa: E402
from server.attempt import record_attempt  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.run import RunSettings  # noqa: E402

CASES = ROOT / "cases"
BENCH = Path(__file__).resolve().parent
# (label, task, source, dims): from a few microseconds to a few milliseconds, memory- and compute-bound.
KERNELS = [
    ("transpose 512x512", "transpose_f32", "initial", {"rows": 512, "cols": 512}),
    ("softmax 2048x1024", "softmax_f32", "initial", {"rows": 2048, "cols": 1024}),
    ("transpose 4096x2048", "transpose_f32", "initial", {"rows": 4096, "cols": 2048}),
    ("layernorm 4096x4096", "layernorm_f32", "initial", {"rows": 4096, "cols": 4096}),
    ("softmax 4096x4096", "softmax_f32", "initial", {"rows": 4096, "cols": 4096}),
    ("layernorm 32768x768", "layernorm_f32", "initial", {"rows": 32768, "cols": 768}),
    ("matmul_f32 512^3", "matmul_f32", "initial", {"m": 512, "n": 512, "k": 512}),
    ("matmul_bf16 2048^3", "matmul_bf16", "initial", {"m": 2048, "n": 2048, "k": 2048}),
    ("matmul_f32 2000x1500x1000", "matmul_f32", "initial", {"m": 2000, "n": 1500, "k": 1000}),
    ("matmul_f32 2048^3", "matmul_f32", "initial", {"m": 2048, "n": 2048, "k": 2048}),
    ("matmul_f32 ref 2048^3", "matmul_f32", "reference", {"m": 2048, "n": 2048, "k": 2048}),
    ("matmul_bf16 ref 2048^3", "matmul_bf16", "reference", {"m": 2048, "n": 2048, "k": 2048}),
]
DISCRIMINATION_CASE = Case(name="bench-1024x1024x2048", role="performance", dims={"m": 1024, "n": 1024, "k": 2048},
                           seed=20261203)
SLOWER = BENCH / "kernels" / "matmul_f32_slower.cu"
OVERHEAD_CANDIDATE = ROOT / "tests" / "gpu" / "kernels" / "tiled32.cu"
OVERHEAD_LAUNCH = {"grid": ["ceil_div(n, 32)", "ceil_div(m, 32)"], "block": [32, 32]}


def case_for(label: str, dims: dict) -> Case:
    return Case(name="bench-" + "x".join(str(v) for v in dims.values()), role="performance", dims=dims,
                seed=sum(map(ord, label)))


class Bench:
    def __init__(self, out: Path, runs: int, trials: int, ncu_passes: int = 1):
        self.out, self.runs, self.trials, self.ncu_passes = out, runs, trials, ncu_passes
        self.results: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "settings": {}}
        self.executors: dict[str, GpuExecutor] = {}
        self.kernels: dict[str, tuple[CompiledKernel, Case, str]] = {}
        # The GPU's lease (harness/gpu_lease.py), held from the first executor's start to the end: nothing else of
        # the referee times on the GPU during the bench, its ncu, direct and triton steps included.
        self.lease = ExitStack()

    def save(self) -> None:
        (self.out / "timing.json").write_text(json.dumps(self.results, indent=1, default=str))

    def executor(self, task_name: str) -> GpuExecutor:
        if task_name not in self.executors:
            executor = GpuExecutor(load_task(CASES / task_name), TimingSettings(), lease_what="bench")
            facts = executor.start()
            if not self.executors and executor.gpu_lease is not None:
                self.lease.enter_context(executor.gpu_lease.held())
            self.results.setdefault("environment", {k: facts.get(k) for k in (
                "gpu", "driver_cuda_version", "nvrtc", "cuda_bindings", "sm_clock_khz", "gpu_state", "nvml_note")})
            self.results["settings"] = TimingSettings().model_dump()
            self.executors[task_name] = executor
        return self.executors[task_name]

    def compiled(self, task_name: str, source: Path, which: str = "initial") -> CompiledKernel:
        executor = self.executor(task_name)
        result = executor.compile(source.read_text(), ())
        if not result.ok:
            raise RuntimeError(f"{source} does not compile:\n{result.log}")
        return CompiledKernel(which, result.cubin, result.lowered_name, executor.task.own_launch(which))

    def load_kernels(self) -> None:
        for label, task_name, which, dims in KERNELS:
            if label not in self.kernels:
                source = CASES / task_name / f"{which}.cu"
                self.kernels[label] = (self.compiled(task_name, source, which), case_for(label, dims), task_name)

    # -- repeatability, and the referee's side of fidelity ---------------------------------------
    def repeatability(self) -> None:
        rows = {label: [] for label, *_ in KERNELS}
        details = {}
        self.load_kernels()
        for run in range(self.runs):
            for executor in self.executors.values():
                executor.fresh_worker()  # each run in a new worker: independent contexts, allocations, clocks
            for label, (kernel, case, task_name) in self.kernels.items():
                timing = self.executor(task_name).time(kernel, [case]).cases[0]
                if not timing.passed:
                    raise RuntimeError(f"{label}: {timing.reasons}")
                rows[label].append(timing.stats.median_ms)
                details.setdefault(label, []).append({"median_ms": timing.stats.median_ms, "clock": timing.clock,
                                                      "kernel_floor_ms": timing.kernel_floor_ms,
                                                      "event_median_ms": timing.event_median_ms,
                                                      "launches": timing.launches,
                                                      "noise": timing.median_rel_halfwidth, "warnings": timing.warnings,
                                                      "gpu": timing.gpu})
            print(f"  run {run + 1}/{self.runs} done", flush=True)
        self.results["kernels"] = [{
            "label": label, "task": task_name, "which": which, "dims": dims, "medians_ms": rows[label],
            "median_ms": statistics.median(rows[label]), "clock": details[label][0]["clock"],
            "event_median_ms": median_or_none([d["event_median_ms"] for d in details[label]]),
            "kernel_floor_ms": median_or_none([d["kernel_floor_ms"] for d in details[label]]),
            "cv": statistics.stdev(rows[label]) / statistics.mean(rows[label]) if len(rows[label]) > 1 else 0.0,
            "runs": details[label]} for label, task_name, which, dims in KERNELS]
        self.save()

    # -- fidelity against outside clocks -----------------------------------------------------
    def plan(self) -> Path:
        path = self.out / "plan.json"
        path.write_text(json.dumps([{
            "label": label, "task": str(CASES / task_name), "which": which,
            "source": str(CASES / task_name / f"{which}.cu"), "case": case_for(label, dims).name, "dims": dims,
            "seed": case_for(label, dims).seed} for label, task_name, which, dims in KERNELS], indent=1))
        return path

    def ncu(self) -> None:
        ncu = shutil.which("ncu")
        if ncu is None:
            self.results["ncu"] = {"note": "ncu is not on PATH"}
            return
        command = [ncu, "--clock-control", "none", "--cache-control", "all", "--metrics", "gpu__time_duration.sum",
                   "--csv", "--print-units", "base", sys.executable, str(BENCH / "direct.py"), "ncu", str(self.plan())]
        summaries = []
        for n in range(1, self.ncu_passes + 1):
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            log = self.out / ("ncu.log" if n == 1 else f"ncu-{n}.log")
            log.write_text(done.stdout + "\n--- stderr\n" + done.stderr)
            values = ncu_durations_ms(done.stdout)
            summary = ncu_summary(values, [label for label, *_ in KERNELS]) if done.returncode == 0 else None
            if summary is None:
                self.results["ncu"] = {"note": f"ncu exit {done.returncode}, {len(values)} values (expected "
                                               f"{REPEATS + REPEATS * SETS * len(KERNELS)}); see {log.name}"}
                return
            summaries.append(summary)
        self.results["ncu"] = ncu_combined(summaries)
        self.save()

    def triton(self) -> None:
        self._direct("triton", "do_bench")

    def clock(self) -> None:
        """Each kernel on the kernel clock outside the referee, one step of its loop added at a time:
        which step, if any, moves a kernel away from ncu."""
        self._direct("clock", "the kernel-clock steps")
        self._direct("clock", "the kernel-clock steps with concurrent tracing", "concurrent")

    def flush(self) -> None:
        """Each kernel by CUDA events after a read of twice L2 (the referee's flush), a memset of it, and
        no flush; and an empty kernel: how much of the gap to ncu the flush and the events make."""
        self._direct("flush", "the flush comparison")

    def _direct(self, mode: str, what: str, *extra: str) -> None:
        """bench/direct.py MODE in its own process; its JSON under results["MODE[_EXTRA]"]."""
        key = "_".join((mode, *extra))
        out = self.out / f"{key}.json"
        done = subprocess.run([sys.executable, str(BENCH / "direct.py"), mode, str(self.plan()), str(out), *extra],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            self.results[key] = {"note": f"{what} did not run (exit {done.returncode}): {done.stderr[-600:]}"}
        else:
            self.results[key] = json.loads(out.read_text())
        self.save()

    # -- fresh inputs against the rotated sets -------------------------------------------------
    def protocols(self, rounds: int = 3) -> None:
        """Each kernel of KERNELS timed `rounds` times under each protocol, alternately, in the same worker
        pool (the rotated executor is a second one, made once): median ratio fresh / rotated, and the
        GPU busy time and wall time per timed launch under each."""
        self.load_kernels()
        rotated: dict[str, GpuExecutor] = {}
        rows = []
        try:
            for label, (kernel, case, task_name) in self.kernels.items():
                if task_name not in rotated:
                    rotated[task_name] = GpuExecutor(load_task(CASES / task_name), TimingSettings(fresh_inputs=False),
                                                     lease_what="bench")
                    rotated[task_name].start()
                runs = {"fresh": [], "rotated": []}
                for r in range(rounds):
                    order = [("fresh", self.executor(task_name)), ("rotated", rotated[task_name])]
                    for name, executor in (order if r % 2 == 0 else order[::-1]):
                        started = time.perf_counter()
                        timing = executor.time(kernel, [case]).cases[0]
                        wall_s = time.perf_counter() - started
                        if not timing.passed:
                            raise RuntimeError(f"{label} ({name}): {timing.reasons}")
                        runs[name].append({"median_ms": timing.stats.median_ms, "launches": timing.launches,
                                           "gpu_busy_ms": timing.gpu_busy_ms, "wall_s": wall_s,
                                           "audited": timing.audited_launches, "inputs": timing.inputs})
                rows.append({"label": label, **{name: protocol_summary(values) for name, values in runs.items()},
                             "runs": runs})
                rows[-1]["ratio"] = rows[-1]["fresh"]["median_ms"] / rows[-1]["rotated"]["median_ms"]
        finally:
            for executor in rotated.values():
                executor.close()
        self.results["protocols"] = {"rounds": rounds, "kernels": rows}
        self.save()

    # -- discrimination ------------------------------------------------------------------------
    def discrimination(self) -> None:
        base = self.compiled("matmul_f32", CASES / "matmul_f32" / "initial.cu")
        slower = self.compiled("matmul_f32", SLOWER)
        executor = self.executor("matmul_f32")
        rounds = RunSettings().timing_rounds

        def trial(first: tuple[str, CompiledKernel], second: tuple[str, CompiledKernel]) -> tuple[float, bool, bool]:
            """(median of B / median of A, B slower beyond noise, B faster beyond noise)."""
            timed = time_side_by_side(executor.time, dict([first, second]), [DISCRIMINATION_CASE], rounds,
                                      judged=("A", "B"))  # both kernels are judged: neither is a yardstick
            a, b = (summarize(timed.samples[label][DISCRIMINATION_CASE.name]) for label in ("A", "B"))
            return b.median_ms / a.median_ms, speedup(b, a).beyond_noise, speedup(a, b).beyond_noise

        slow, same = [], []
        for i in range(self.trials):
            pair = [("A", base), ("B", slower)]
            slow.append(trial(*(pair if i % 2 == 0 else pair[::-1])))
            same.append(trial(("A", base), ("B", base)))
        self.results["discrimination"] = {
            "case": DISCRIMINATION_CASE.model_dump(), "rounds": rounds, "trials": self.trials,
            "slower_ratio_median": statistics.median(r for r, _, _ in slow),
            "slower_ranked_slower": sum(r > 1 for r, _, _ in slow),
            "slower_beyond_noise": sum(s for _, s, _ in slow),
            "slower_wrongly_faster": sum(f for _, _, f in slow),
            "aa_ratio_spread": [min(r for r, _, _ in same), max(r for r, _, _ in same)],
            "aa_false_claims": sum(s or f for _, s, f in same),
            "trials_slower": slow, "trials_aa": same}
        self.save()

    # -- overhead -------------------------------------------------------------------------------
    def overhead(self) -> None:
        executor = self.executor("matmul_f32")
        started = time.perf_counter()
        executor.fresh_worker()
        executor.pool.candidate.ensure_started()
        cold_start_s = time.perf_counter() - started
        source = OVERHEAD_CANDIDATE.read_text() + f"\n// bench {time.time_ns()}\n"  # a compile, not a cache hit
        first = executor.compile(source, ())
        started = time.perf_counter()
        executor.compile(source, ())  # the same source again: the cache answers
        hit_ms = (time.perf_counter() - started) * 1e3

        run_executor = GpuExecutor(load_task(CASES / "matmul_f32"), TimingSettings(), lease_what="bench")
        busy = {"s": 0.0}
        timed = run_executor.time

        def time_and_count(kernel, cases):
            """Counts the GPU time of every timed launch, warm-ups included (at the case's median)."""
            report = timed(kernel, cases)
            for c in report.cases:
                if c.stats is not None:
                    warmups = run_executor.settings.warmups * c.batches
                    busy["s"] += (sum(c.samples_ms) + warmups * c.stats.median_ms) * 1e-3
            return report

        run_executor.time = time_and_count
        calls = {name: wall_clocked(run_executor, name)  # read_mix: beside the checks (server/mix_reading.py)
                 for name in ("check", "time", "time_vendor", "compile", "read_mix")}
        with tempfile.TemporaryDirectory() as results:
            run = new_run(CASES / "matmul_f32", Path(results), RunSettings(), run_executor)
            busy["s"] = 0.0  # the baseline was timed in Run.create: only record_attempt's share counts
            for clock in calls.values():
                clock.calls, clock.seconds = 0, 0.0
            try:
                candidate = run.candidate(None, OVERHEAD_CANDIDATE.read_text() + f"\n// overhead {time.time_ns()}\n",
                                          None, OVERHEAD_LAUNCH)
                with gpu_busy_counted() as measured:
                    started = time.perf_counter()
                    answer = record_attempt(run, candidate, "bench: overhead", None, None)
                    wall_s = time.perf_counter() - started
                entry = run.history[-1]
            finally:
                run_executor.close()
                run.close()
        # The GPU's busy time as the kernel clock saw it in every job (kernels, copies, memsets), where
        # every answer had it; else the timed launches' own time.
        clocked = bool(measured["jobs"]) and not measured["unclocked"]
        gpu_busy_s = measured["ms"] * 1e-3 if clocked else busy["s"]
        compile_s = ((entry.compile.compile_ms if entry.compile else None) or 0.0) / 1e3
        self.results["overhead"] = {
            "record_attempt_wall_s": wall_s, "verdict": answer.verdict, "compile_s": compile_s,
            "gpu_busy_s": gpu_busy_s, "bound_s": compile_s + 1.3 * gpu_busy_s + 0.3,
            "gpu_busy_source": "kernel clock, every job" if clocked else "timed launches",
            "timed_launches_s": busy["s"], "worker_jobs": measured,
            "host_s": wall_s - compile_s - gpu_busy_s, "worker_cold_start_s": cold_start_s,
            "compile_ms": first.compile_ms, "cache_hit_ms": hit_ms,
            # per case, the chance at most that a kernel wrong on most launches passed every audit (harness/audit_bound.py)
            "audit_escape_bound": {name: row.audit_escape_bound for name, row in (entry.timing or {}).items()},
            "executor_calls": {name: clock.summary() for name, clock in calls.items()}}
        self.save()

    def close(self) -> None:
        for executor in self.executors.values():
            executor.close()
        self.lease.close()


def on_one_gpu(choice: str | None) -> Placement | None:
    """The bench's GPU (harness/placement.py), made the only one that this process and every one it starts (the
    workers, ncu, bench/direct.py) see: CUDA_VISIBLE_DEVICES is set to its UUID."""
    placement = placement_for(list_gpus(), choice, "bench")
    if placement is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = placement.gpu.uuid
        print(f"on {placement.gpu.describe()}", flush=True)
    return placement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--ncu-passes", type=int, default=1, help="ncu's step this many times, to show its own spread")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--only", help="run only these steps, comma-separated (e.g. repeatability,ncu,protocols)")
    parser.add_argument("--gpu", help="the GPU to bench on: an index or a UUID (default: one no run serves on)")
    args = parser.parse_args(argv)
    if min(args.runs, args.trials, args.ncu_passes) < 1:
        parser.error("--runs, --trials and --ncu-passes take a count of at least 1")
    if (reason := gpu_absent_reason()) is not None:
        print(f"bench/timing.py measures timing on a GPU, and there is none here: {reason}", file=sys.stderr)
        return 2
    placement = on_one_gpu(args.gpu)  # noqa: F841 - its claim is held while the bench runs
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.out, args.runs, args.trials, args.ncu_passes)
    steps = [("repeatability", bench.repeatability)]
    steps += [] if args.no_ncu else [("ncu", bench.ncu)]
    steps += [("clock", bench.clock), ("flush", bench.flush)]
    steps += [("discrimination", bench.discrimination), ("overhead", bench.overhead)]
    steps += [("protocols", bench.protocols)]
    if args.only:
        wanted = set(args.only.split(","))
        if unknown := wanted - {name for name, _ in steps}:
            parser.error(f"--only: no step {', '.join(sorted(unknown))}")
        steps = [(name, step) for name, step in steps if name in wanted]
    steps += [] if args.no_triton else [("triton", bench.triton)]
    try:
        for name, step in steps:
            started = time.perf_counter()
            print(f"{name} ...", flush=True)
            step()
            bench.results.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
            bench.save()
    finally:
        bench.close()
    print(report(bench.results))
    print(f"\nwrote {args.out / 'timing.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
