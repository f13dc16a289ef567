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
import contextlib
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.direct import REPEATS, SETS  # noqa: E402
from harness.device import gpu_absent_reason  # noqa: E402
from harness.settings import CompiledKernel, TimingSettings  # noqa: E402
from harness.stats import speedup, summarize  # noqa: E402
from harness.task_model import Case  # noqa: E402
from harness.task import load_task  # noqa: E402
from harness.side_by_side import time_side_by_side  # noqa: E402
from server.attempt import record_attempt  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.run import RunSettings  # noqa: E402
from sandbox.pool import Worker  # noqa: E402

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

    def save(self) -> None:
        (self.out / "timing.json").write_text(json.dumps(self.results, indent=1, default=str))

    def executor(self, task_name: str) -> GpuExecutor:
        if task_name not in self.executors:
            executor = GpuExecutor(load_task(CASES / task_name), TimingSettings())
            facts = executor.start()
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
                                                      "noise": timing.noise, "warnings": timing.warnings,
                                                      "gpu": timing.gpu})
            print(f"  run {run + 1}/{self.runs} done", flush=True)
        self.results["kernels"] = [{
            "label": label, "task": task_name, "which": which, "dims": dims, "medians_ms": rows[label],
            "median_ms": statistics.median(rows[label]), "clock": details[label][0]["clock"],
            "event_median_ms": _median_or_none([d["event_median_ms"] for d in details[label]]),
            "kernel_floor_ms": _median_or_none([d["kernel_floor_ms"] for d in details[label]]),
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
                    rotated[task_name] = GpuExecutor(load_task(CASES / task_name), TimingSettings(fresh_inputs=False))
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
                rows.append({"label": label, **{name: _protocol_summary(values) for name, values in runs.items()},
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
            timed = time_side_by_side(executor.time, dict([first, second]), [DISCRIMINATION_CASE], rounds)
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
        hit = executor.compile(source, ())
        hit_ms = (time.perf_counter() - started) * 1e3

        run_executor = GpuExecutor(load_task(CASES / "matmul_f32"), TimingSettings())
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
        calls = {name: _wall_clocked(run_executor, name) for name in ("check", "time", "time_vendor", "compile")}
        with tempfile.TemporaryDirectory() as results:
            run = new_run(CASES / "matmul_f32", Path(results), RunSettings(), run_executor)
            busy["s"] = 0.0  # the baseline was timed in Run.create: only record_attempt's share counts
            for clock in calls.values():
                clock.calls, clock.seconds = 0, 0.0
            try:
                candidate = run.candidate(None, OVERHEAD_CANDIDATE.read_text() + f"\n// overhead {time.time_ns()}\n",
                                          None, OVERHEAD_LAUNCH)
                with _gpu_busy_counted() as measured:
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
        compile_s = (entry.get("compile") or {}).get("compile_ms", 0.0) / 1e3
        self.results["overhead"] = {
            "record_attempt_wall_s": wall_s, "verdict": answer.verdict, "compile_s": compile_s,
            "gpu_busy_s": gpu_busy_s, "bound_s": compile_s + 1.3 * gpu_busy_s + 0.3,
            "gpu_busy_source": "kernel clock, every job" if clocked else "timed launches",
            "timed_launches_s": busy["s"], "worker_jobs": measured,
            "host_s": wall_s - compile_s - gpu_busy_s, "worker_cold_start_s": cold_start_s,
            "compile_ms": first.compile_ms, "cache_hit_ms": hit_ms,
            "executor_calls": {name: clock.summary() for name, clock in calls.items()}}
        self.save()

    def close(self) -> None:
        for executor in self.executors.values():
            executor.close()


def _protocol_rows(protocols: dict) -> list[str]:
    if not protocols.get("kernels"):
        return []
    lines = ["", f"fresh inputs (drawn on the device for every launch) against the rotated fixed sets, "
                 f"{protocols['rounds']} timings each, alternately",
             "| kernel | fresh (us) | rotated (us) | fresh / rotated | GPU busy per launch, fresh / rotated (us) "
             "| wall per launch, fresh / rotated (us) |", "|---|---|---|---|---|---|"]
    for k in protocols["kernels"]:
        fresh, rotated = k["fresh"], k["rotated"]
        busy = (f"{fresh['gpu_busy_us_per_launch']:.1f} / {rotated['gpu_busy_us_per_launch']:.1f}"
                if fresh["gpu_busy_us_per_launch"] and rotated["gpu_busy_us_per_launch"] else "—")
        lines.append(f"| {k['label']} | {fresh['median_ms'] * 1e3:.1f} | {rotated['median_ms'] * 1e3:.1f} | "
                     f"{k['ratio']:.4f} | {busy} | {fresh['wall_us_per_launch']:.0f} / "
                     f"{rotated['wall_us_per_launch']:.0f} |")
    return lines


def _protocol_summary(runs: list[dict]) -> dict:
    """Median of the medians, and the busy and wall time per timed launch, over one protocol's runs."""
    launches = sum(r["launches"] for r in runs)
    busy = [r["gpu_busy_ms"] for r in runs]
    return {"median_ms": statistics.median(r["median_ms"] for r in runs),
            "gpu_busy_us_per_launch": sum(busy) * 1e3 / launches if None not in busy else None,
            "wall_us_per_launch": sum(r["wall_s"] for r in runs) * 1e6 / launches}


@contextlib.contextmanager
def _gpu_busy_counted():
    """Adds up the GPU busy time every worker answer reports while the block runs."""
    measured = {"jobs": 0, "unclocked": 0, "ms": 0.0, "each": []}
    call = Worker.call

    def counted(self, header, blobs, *args, **kwargs):
        started = time.perf_counter()
        answer, back = call(self, header, blobs, *args, **kwargs)
        if header.get("op") not in ("run", "time", "vendor_time", "draw_run"):
            return answer, back  # a compile worker's job: no GPU there
        measured["jobs"] += 1
        measured["each"].append({"op": header.get("op"), "wall_s": round(time.perf_counter() - started, 4),
                                 "gpu_busy_ms": answer.get("gpu_busy_ms"), "phases_s": answer.get("phases_s"),
                                 "sent_bytes": sum(len(b) for b in blobs), "back_bytes": sum(len(b) for b in back)})
        if answer.get("gpu_busy_ms") is None:
            measured["unclocked"] += 1
        else:
            measured["ms"] += answer["gpu_busy_ms"]
        return answer, back

    Worker.call = counted
    try:
        yield measured
    finally:
        Worker.call = call


NCU_UNITS_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


class _WallClock:
    def __init__(self):
        self.calls, self.seconds = 0, 0.0

    def summary(self) -> dict:
        return {"calls": self.calls, "wall_s": round(self.seconds, 3)}


def _wall_clocked(executor, name: str) -> _WallClock:
    """Replace executor.<name> by a wrapper that adds up its calls' wall time: where record_attempt's time goes."""
    clock, inner = _WallClock(), getattr(executor, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            clock.calls += 1
            clock.seconds += time.perf_counter() - started

    setattr(executor, name, timed)
    return clock


def _referee_floor(results: dict) -> float | None:
    """The empty kernel's reading on the referee's clock (the median over the bench's timings)."""
    floors = [k["kernel_floor_ms"] for k in results.get("kernels", []) if k.get("kernel_floor_ms")]
    return statistics.median(floors) if floors else None


def _median_or_none(values: list) -> float | None:
    return statistics.median(values) if values and None not in values else None


def ncu_durations_ms(text: str) -> list[float]:
    """gpu__time_duration of every profiled launch, in launch order, from `ncu --csv` output."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    values = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            unit = row.get("Metric Unit", "ns").strip().lower()
            values.append(float(row["Metric Value"].replace(",", "")) * NCU_UNITS_MS[unit])
    return values


def ncu_summary(values: list[float], labels: list[str]) -> dict | None:
    """ncu's values in bench/direct.py's launch order (an empty kernel REPEATS times, then for each
    kernel REPEATS rounds over the SETS input sets): the median of each kernel, of each of its sets,
    and the empty kernel's. None if the count is not that."""
    per_kernel = REPEATS * SETS
    if len(values) != REPEATS + per_kernel * len(labels):
        return None
    empty, values = values[:REPEATS], values[REPEATS:]
    mine = {label: values[i * per_kernel:(i + 1) * per_kernel] for i, label in enumerate(labels)}
    return {"empty_kernel_ms": statistics.median(empty), "sets": SETS, "repeats_per_set": REPEATS,
            "median_ms": {label: statistics.median(v) for label, v in mine.items()},
            # launches go round the sets: set s is every SETS-th value from s
            "per_set_ms": {label: [statistics.median(v[s::SETS]) for s in range(SETS)] for label, v in mine.items()}}


def ncu_combined(summaries: list[dict]) -> dict:
    """Several ncu passes as one: each kernel's (and the empty kernel's) median over the passes'
    medians, with each pass's median kept; the per-set medians are the first pass's."""
    if len(summaries) == 1:
        return summaries[0]
    per_pass = {label: [s["median_ms"][label] for s in summaries] for label in summaries[0]["median_ms"]}
    return {**summaries[0], "passes": len(summaries),
            "empty_kernel_ms": statistics.median(s["empty_kernel_ms"] for s in summaries),
            "median_ms": {label: statistics.median(v) for label, v in per_pass.items()}, "pass_medians_ms": per_pass}


def _ncu_passes(ncu: dict) -> list[str]:
    """ncu's own spread: each kernel's lowest and highest median over the bench's ncu passes."""
    passes = ncu.get("pass_medians_ms")
    if not passes:
        return []
    lines = ["", f"ncu's own spread over {ncu['passes']} passes (each the whole ncu step):",
             "| kernel | lowest (us) | highest (us) | spread |", "|---|---|---|---|"]
    for label, values in passes.items():
        low, high = min(values), max(values)
        lines.append(f"| {label} | {low * 1e3:.1f} | {high * 1e3:.1f} | {(high - low) / statistics.median(values):.2%} |")
    return lines


def _clock_steps(results: dict, ncu: dict) -> list[str]:
    """The kernel clock outside the referee, step by step, beside ncu (bench/direct.py clock)."""
    lines = []
    for key in ("clock", "clock_concurrent"):
        steps = results.get(key) or {}
        if not steps.get("median_ms"):
            if steps.get("note"):
                lines.append(f"\n{key}: {steps['note']}")
            continue
        names = list(next(iter(steps["median_ms"].values())))
        lines += ["", f"on the kernel clock outside the referee, {steps.get('tracing', 'serial')} tracing "
                      f"(an empty kernel reads {steps['empty_kernel_ms'] * 1e3:.2f} us):",
                  "| kernel | " + " | ".join(names) + " | ncu (us) |", "|---" * (len(names) + 2) + "|"]
        for label, medians in steps["median_ms"].items():
            theirs = ncu.get(label)
            lines.append(f"| {label} | " + " | ".join(f"{medians[n] * 1e3:.1f}" for n in names) + " | "
                         + (f"{theirs * 1e3:.1f} |" if theirs else "— |"))
    return lines


FIDELITY_FROM_MS, FIDELITY_WITHIN = 0.020, 0.02
REPEATABLE_FROM_MS, REPEATABLE_CV = 0.050, 0.005
# Fresh inputs must not move an honest kernel's median: within this of the rotated sets' from 50 us.
PROTOCOL_WITHIN = 0.01


def targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """(target, met or None where not measured, what was measured) for each of the bench's targets."""
    kernels = results.get("kernels", [])
    ncu = (results.get("ncu") or {}).get("median_ms", {})
    floor, ncu_floor = _referee_floor(results), (results.get("ncu") or {}).get("empty_kernel_ms")
    rows = []
    long = [(k, ncu[k["label"]]) for k in kernels if ncu.get(k["label"], 0) >= FIDELITY_FROM_MS]
    if long:
        raw = max(abs(k["median_ms"] / theirs - 1) for k, theirs in long)
        rows.append((f"within {FIDELITY_WITHIN:.0%} of ncu from {FIDELITY_FROM_MS * 1e3:.0f} us", raw <= FIDELITY_WITHIN,
                     f"at most {raw:.2%} off, over {len(long)} kernels"))
        if floor and ncu_floor:
            net = max(abs((k["median_ms"] - floor) / (theirs - ncu_floor) - 1) for k, theirs in long)
            rows.append(("the same, net of each clock's empty kernel", net <= FIDELITY_WITHIN, f"at most {net:.2%} off"))
    else:
        rows.append((f"within {FIDELITY_WITHIN:.0%} of ncu from {FIDELITY_FROM_MS * 1e3:.0f} us", None, "no ncu values"))
    steady = [k for k in kernels if k["median_ms"] >= REPEATABLE_FROM_MS]
    worst = max((k["cv"] for k in steady), default=None)
    rows.append((f"CV <= {REPEATABLE_CV:.1%} over runs from {REPEATABLE_FROM_MS * 1e3:.0f} us",
                 None if worst is None else worst <= REPEATABLE_CV,
                 "no kernel that long" if worst is None else f"at most {worst:.2%}, over {len(steady)} kernels"))
    if d := results.get("discrimination"):
        rows.append(("a 2% slower copy slower beyond noise in >= 19 of 20, never faster",
                     d["slower_beyond_noise"] >= 0.95 * d["trials"] and d["slower_wrongly_faster"] == 0,
                     f"{d['slower_beyond_noise']} of {d['trials']}, wrongly faster {d['slower_wrongly_faster']}"))
        rows.append(("A/A: no false claim", d["aa_false_claims"] == 0, f"{d['aa_false_claims']} of {d['trials']}"))
    steady = [k for k in (results.get("protocols") or {}).get("kernels", [])
              if k["rotated"]["median_ms"] >= REPEATABLE_FROM_MS]
    if steady:
        worst = max(abs(k["ratio"] - 1) for k in steady)
        rows.append((f"fresh inputs within {PROTOCOL_WITHIN:.0%} of the rotated sets from "
                     f"{REPEATABLE_FROM_MS * 1e3:.0f} us", worst <= PROTOCOL_WITHIN,
                     f"at most {worst:.2%} apart, over {len(steady)} kernels"))
    if o := results.get("overhead"):
        rows.append(("record_attempt <= compile + 1.3 x GPU busy + 0.3 s", o["record_attempt_wall_s"] <= o["bound_s"],
                     f"{o['record_attempt_wall_s']:.2f} s against {o['bound_s']:.2f} s"))
    return rows


def report(results: dict) -> str:
    clocks = {k.get("clock", "events") for k in results.get("kernels", [])}
    lines = [f"the referee's clock: {', '.join(sorted(clocks)) or '—'}",
             "| kernel | referee median (us) | CV over runs | its events (us) | ncu (us) | vs ncu | do_bench (us) | vs do_bench |",
             "|---|---|---|---|---|---|---|---|"]
    ncu = (results.get("ncu") or {}).get("median_ms", {})
    triton = (results.get("triton") or {}).get("median_ms", {})
    for k in results.get("kernels", []):
        ours = k["median_ms"]
        theirs = [ncu.get(k["label"]), triton.get(k["label"])]
        cells = []
        for value in theirs:
            cells += [f"{value * 1e3:.1f}", f"{ours / value - 1:+.2%}"] if value else ["—", "—"]
        events = f"{k['event_median_ms'] * 1e3:.1f}" if k.get("event_median_ms") else "—"
        lines.append(f"| {k['label']} | {ours * 1e3:.1f} | {k['cv']:.2%} | {events} | " + " | ".join(cells) + " |")
    floor, ncu_floor = _referee_floor(results), (results.get("ncu") or {}).get("empty_kernel_ms")
    if floor and ncu_floor and ncu:
        lines += ["", f"net of each clock's empty kernel (the referee's {floor * 1e3:.2f} us, ncu's "
                      f"{ncu_floor * 1e3:.2f} us): what the kernel adds to an empty launch on each",
                  "| kernel | referee net (us) | ncu net (us) | vs ncu |", "|---|---|---|---|"]
        for k in results.get("kernels", []):
            if (theirs := ncu.get(k["label"])) is not None:
                ours_net, theirs_net = k["median_ms"] - floor, theirs - ncu_floor
                lines.append(f"| {k['label']} | {ours_net * 1e3:.1f} | {theirs_net * 1e3:.1f} | "
                             f"{ours_net / theirs_net - 1:+.2%} |")
    for section in ("ncu", "triton"):
        if note := (results.get(section) or {}).get("note"):
            lines.append(f"\n{section}: {note}")
    if (empty := (results.get("ncu") or {}).get("empty_kernel_ms")) is not None:
        lines.append(f"\nncu reads an empty kernel at {empty * 1e3:.2f} us")
    lines += _ncu_passes(results.get("ncu") or {})
    lines += _clock_steps(results, ncu)
    lines += _protocol_rows(results.get("protocols") or {})
    flush = results.get("flush") or {}
    if flush.get("median_ms"):
        lines += ["", f"by CUDA events, after each flush (an empty kernel reads {flush['empty_kernel_ms'] * 1e3:.2f} us):",
                  "| kernel | read flush (us) | memset flush (us) | no flush (us) | ncu (us) |", "|---|---|---|---|---|"]
        for label, ways in flush["median_ms"].items():
            theirs = ncu.get(label)
            lines.append(f"| {label} | {ways['read'] * 1e3:.1f} | {ways['memset'] * 1e3:.1f} | {ways['none'] * 1e3:.1f} | "
                         + (f"{theirs * 1e3:.1f} |" if theirs else "— |"))
    elif flush.get("note"):
        lines.append(f"\nflush: {flush['note']}")
    d = results.get("discrimination")
    if d:
        lines.append(f"\ndiscrimination on {d['case']['name']}: the 2%-slower copy (median ratio "
                     f"{d['slower_ratio_median']:.4f}) ranked slower in {d['slower_ranked_slower']}/{d['trials']}, "
                     f"slower beyond noise in {d['slower_beyond_noise']}/{d['trials']}, "
                     f"wrongly faster in {d['slower_wrongly_faster']}/{d['trials']}; "
                     f"A/A false claims {d['aa_false_claims']}/{d['trials']} "
                     f"(ratios {d['aa_ratio_spread'][0]:.4f} to {d['aa_ratio_spread'][1]:.4f})")
    o = results.get("overhead")
    if o:
        lines.append(f"overhead: record_attempt {o['record_attempt_wall_s']:.2f} s ({o['verdict']}) against the bound "
                     f"compile + 1.3 x GPU busy ({o.get('gpu_busy_source', 'timed launches')}) + 0.3 s = "
                     f"{o['compile_s']:.2f} + 1.3 x {o['gpu_busy_s']:.2f} + 0.3 = "
                     f"{o['bound_s']:.2f} s; host time {o['host_s']:.2f} s; worker cold start "
                     f"{o['worker_cold_start_s']:.2f} s; compile {o['compile_ms']:.0f} ms, cache hit {o['cache_hit_ms']:.1f} ms")
        calls = o.get("executor_calls") or {}
        if calls:
            lines.append("record_attempt's executor calls: " + ", ".join(
                f"{name} {c['calls']} in {c['wall_s']:.2f} s" for name, c in calls.items()))
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'—' if met is None else ('yes' if met else 'no')} | {what} |"
              for name, met, what in targets(results)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--ncu-passes", type=int, default=1, help="ncu's step this many times, to show its own spread")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--only", help="run only these steps, comma-separated (e.g. repeatability,ncu,protocols)")
    args = parser.parse_args(argv)
    if min(args.runs, args.trials, args.ncu_passes) < 1:
        parser.error("--runs, --trials and --ncu-passes take a count of at least 1")
    if (reason := gpu_absent_reason()) is not None:
        print(f"bench/timing.py measures timing on a GPU, and there is none here: {reason}", file=sys.stderr)
        return 2
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
