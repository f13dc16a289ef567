"""`kernel-referee check`: the full protocol on a task's reference, its baseline or a given file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from harness.vendor_yardstick import VendorReport
from harness.worker_side.compile_policy import DEFAULT_ARCH, CompileResult
from harness.device import gpu_absent_reason
from harness.gpus import list_gpus, placement_for
from harness.settings import CompiledKernel, TimingSettings
from harness.footprint import DoesNotFit, available_memory_bytes, host_shortfalls, oracle_shortfalls, shortfalls
from harness.oracle import OutputSummary, run_oracle, summarize
from harness.peaks import DevicePeaks
from harness.stats import geometric_mean
from harness.compare import compare_output
from harness.task_model import LaunchSpec, Task
from harness.task import make_inputs
from harness.results import CaseTiming, CheckReport, TimingReport
from harness.timing_shape import shape_waived
from harness.compile_service import CompileService
from server.executor import GpuExecutor

EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 3


@dataclass
class Target:
    label: str
    source: str
    launch: LaunchSpec
    own: bool = False  # the task's own kernel (reference, initial): a yardstick, its launches' shape not judged
    compiled: CompileResult | None = None
    check: CheckReport | None = None
    timing: TimingReport | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.compiled and self.compiled.ok and self.check and self.check.passed
                    and self.timing and self.timing.passed)


def targets_for(task: Task, kernel_file: Path | None, launch: LaunchSpec | None) -> list[Target]:
    if kernel_file is not None:
        return [Target(str(kernel_file), kernel_file.read_text(), launch or task.launch)]
    return [Target(which, task.source(which), task.own_launch(which), own=True) for which in ("reference", "initial")]


def run_check(task: Task, targets: list[Target], settings: TimingSettings, out: TextIO, json_path: Path | None = None,
              confine: bool = True, gpu: str | None = None) -> int:
    """`gpu`: `--gpu` (an index or a UUID); None: a GPU no serving run holds (harness/placement.py)."""
    hello: dict | None = None
    yardsticks: dict = {"peaks": None, "vendor": None, "oracle": None}  # filled as they are measured
    try:
        code, hello = _run(task, targets, settings, out, confine, yardsticks, gpu)
    finally:
        if json_path is not None:
            _write_json(json_path, task, targets, hello, yardsticks)
    return code


def _run(task: Task, targets: list[Target], settings: TimingSettings, out: TextIO, confine: bool,
         yardsticks: dict, gpu: str | None) -> tuple[int, dict | None]:
    absent = gpu_absent_reason()
    if absent is not None:
        return _without_gpu(task, targets, out, confine, absent, yardsticks), None
    problems = host_shortfalls(task, settings, available_memory_bytes(), serving=False)
    if problems:
        raise DoesNotFit(problems)
    placement = placement_for(list_gpus(), gpu, f"check {task.name}")
    try:
        executor = GpuExecutor(task, settings, confine=confine, lease_what=f"check {task.name}",
                               gpu=placement.gpu if placement else None)
    except BaseException:
        if placement is not None:
            placement.release()
        raise
    try:
        hello = executor.hello()
        _print_device(hello, out)
        _compiled(targets, lambda source: executor.compile(source, ()), out)
        reference = executor.compile(task.source("reference"), ())
        if not reference.ok:
            print(f"\nThe task's reference does not compile:\n{reference.log}", file=out)
            return EXIT_FAILED, hello
        problems = shortfalls(task, settings, hello["device"])
        if problems:
            raise DoesNotFit(problems)
        facts = executor.start()
        yardsticks["peaks"] = facts["peaks"]
        print_peaks(executor.referee.peaks, facts["peaks_notes"], out)
        _print_oracle(task, executor, out)
        for target in targets:
            _check_and_time(task, executor, target, out)
        vendor = executor.time_vendor(list(task.performance_cases))
        yardsticks["vendor"] = vendor.model_dump(mode="json") if vendor else None
        print_vendor(vendor, targets, out)
    finally:
        if executor.gpu_lease is not None:  # waits for another process's timing on this GPU, and whose
            yardsticks["gpu_lease_waits"] = [w.model_dump(mode="json") for w in executor.gpu_lease.waits]
        executor.close()
        if placement is not None:
            placement.release()
    return (EXIT_OK if all(t.passed for t in targets) else EXIT_FAILED), hello


def _without_gpu(task: Task, targets: list[Target], out: TextIO, confine: bool, absent: str, yardsticks: dict) -> int:
    """What runs without a GPU: the compiles, and the oracle on the correctness cases (on the CPU, in this
    process). Running kernels is what is left undone: EXIT_NO_GPU."""
    cases = list(task.correctness_cases)
    problems = oracle_shortfalls(task, cases, available_memory_bytes())
    if problems:
        raise DoesNotFit(problems)
    with CompileService(confine=confine) as compiler:  # a --kernel file is untrusted: a confined compile
        _compiled(targets, lambda source: compiler.compile(source, task.kernel_name, arch=DEFAULT_ARCH), out)
    yardsticks["oracle"] = _oracle_on_cpu(task, cases, out)
    failed = [t.label for t in targets if not t.compiled.ok]
    if failed:  # known without a GPU: the kernel fails, with the exit a GPU would give it
        print(f"\nNo GPU: {absent}.\n{', '.join(failed)} does not compile for {DEFAULT_ARCH}: FAIL", file=out)
        return EXIT_FAILED
    print(f"\nNo GPU: {absent}.\nCompiled {len(targets)} kernel(s) for {DEFAULT_ARCH} above; "
          "running, checking and timing need an NVIDIA GPU.", file=out)
    return EXIT_NO_GPU


def _oracle_on_cpu(task: Task, cases: list, out: TextIO) -> dict | None:
    """Each correctness case's oracle outputs, summarized: shape, dtype, NaN/Inf, finite range."""
    if task.oracle_file is None:
        print("\noracle: the task declares none (task.toml `oracle`); nothing runs without a GPU", file=out)
        return None
    print(f"\noracle ({task.oracle_file}) on the correctness cases, on the CPU:", file=out)
    found = {}
    for case in cases:
        summaries = summarize(task, case.dims, make_inputs(task, case.dims, case.seed), case.name)
        found[case.name] = [asdict(s) for s in summaries]
        declared = {p.name: p.dtype for p in task.output_params}
        for summary in summaries:
            print(f"  {case.name}: {_summary_line(summary, declared[summary.name])}", file=out)
    return found


def _summary_line(s: OutputSummary, declared: str) -> str:
    shape = "x".join(str(n) for n in s.shape)
    finite = "all finite" if s.finite else f"{s.nan} NaN, {s.inf} Inf"
    span = f"min {s.low:.6g}, max {s.high:.6g}" if s.low is not None else "no finite value"
    return f"{s.name} {shape} {s.dtype} (the output is {declared}), {finite}, {span}"


def _compiled(targets: list[Target], compile_source: Callable[[str], CompileResult], out: TextIO) -> None:
    for target in targets:
        target.compiled = compile_source(target.source)
        _print_compile(target, out)


def _check_and_time(task: Task, executor: GpuExecutor, target: Target, out: TextIO) -> None:
    print(f"\n== {target.label}", file=out)
    if not target.compiled.ok:
        print("   does not compile", file=out)
        return
    kernel = CompiledKernel(target.label, target.compiled.cubin, target.compiled.lowered_name, target.launch)
    target.check = executor.check(kernel, list(task.visible_cases) + list(task.holdout_cases))
    if target.check.passed:
        timing = executor.time(kernel, list(task.performance_cases))
        target.timing = shape_waived(timing) if target.own else timing  # the task's own kernels are yardsticks
    _print_table(target, out)
    _print_where_judged(target.check, executor.referee.device_off, out)


def _print_where_judged(check, device_off: str | None, out: TextIO) -> None:
    """Which cases' outputs were compared on the GPU (harness/device_checks.py), and why none was if it was
    meant to be."""
    on_device = [c.case for c in check.cases if c.judged_on == "device"]
    if on_device:
        print(f"   judged on the GPU (outputs compared where they lie): {', '.join(on_device)}", file=out)
    if device_off is not None:
        print(f"   judged on the host instead of the GPU: {device_off}", file=out)


def _print_device(hello: dict, out: TextIO) -> None:
    d = hello["device"]
    major, minor = d["compute_capability"]
    driver = d["driver_version"]
    print(f"GPU {d['name']} (sm_{major}{minor}, {d['sm_count']} SMs, L2 {d['l2_bytes'] / 2**20:.0f} MiB, "
          f"CUDA driver {driver // 1000}.{driver % 1000 // 10}); event overhead "
          f"{hello['event_overhead_ms'] * 1e3:.2f} us", file=out)


def _print_compile(target: Target, out: TextIO) -> None:
    c = target.compiled
    if not c.ok:
        print(f"{target.label}: compile FAILED ({c.compile_ms:.0f} ms)\n{c.log}", file=out)
        return
    r = c.resources
    report = "no resource report" if r is None else (
        f"{r.registers} registers, {r.spill_store_bytes + r.spill_load_bytes} spill bytes, "
        f"{r.shared_bytes} B shared, {r.stack_bytes} B stack")
    print(f"{target.label}: compiled for {c.arch} in {c.compile_ms:.0f} ms: {report}", file=out)


def _print_oracle(task: Task, executor: GpuExecutor, out: TextIO) -> None:
    if task.oracle_file is None:
        return
    worst = []
    for case in list(task.visible_cases) + list(task.holdout_cases):
        if executor.referee.draws(case) is not None:  # inputs drawn on the device: too large for the host's oracle
            worst.append(f"{case.name} not compared (inputs drawn on the device)")
            continue
        expected = executor.expected(case, case.seed)
        truth = run_oracle(task, case.dims, executor.referee.host_inputs(case, case.seed), case.name)
        for name, array in truth.items():
            tol = task.tolerances[name]
            check = compare_output(name, array, expected[name].astype("float64"), tol.rtol, tol.atol)
            worst.append(f"{case.name} {'ok' if check.passed else 'FAILS'} (max abs {check.max_abs_error:.2g})")
    print("reference vs float64 oracle: " + "; ".join(worst), file=out)


def _print_table(target: Target, out: TextIO) -> None:
    timings = {t.case: t for t in (target.timing.cases if target.timing else [])}
    header = f"{'case':<22}{'role':<13}{'check':<7}{'max abs err':>12}" + TIMING_HEADER
    print(header, file=out)
    for case in target.check.cases:
        errors = max((o.max_abs_error for o in case.outputs), default=float("nan"))
        line = f"{case.case:<22}{case.role:<13}{'pass' if case.passed else 'FAIL':<7}{errors:>12.2e}"
        t = timings.get(case.case)
        if t and t.stats:
            line += timing_cells(t)
        print(line, file=out)
    reasons = target.check.reasons + (target.timing.reasons if target.timing else [])
    for reason in reasons:
        print(f"   rejected: {reason.code.value} [{reason.case}]: {reason.detail}", file=out)
    cases = target.check.cases + (target.timing.cases if target.timing else [])
    for case in cases:
        for warning in case.warnings:
            print(f"   warning [{case.case}]: {warning}", file=out)
    verdict = "PASS" if target.passed else "FAIL"
    score = f"; score (geometric mean of medians) {target.timing.score_ms * 1e3:.2f} us" \
        if target.timing and target.timing.score_ms else ""
    print(f"   {verdict}{score}", file=out)


TIMING_HEADER = f"{'median us':>11}{'p10-p90 us':>17}{'CV %':>7}{'GB/s':>9}{'TFLOP/s':>9}{'roof %':>8}"


def timing_cells(t: CaseTiming) -> str:
    """A timed case's columns under TIMING_HEADER; roof % is the roofline bound / median (- without peaks)."""
    s = t.stats
    roof = f"{t.roofline_fraction * 100:>8.1f}" if t.roofline_fraction is not None else f"{'-':>8}"
    return (f"{s.median_ms * 1e3:>11.2f}{f'{s.p10_ms * 1e3:.2f}-{s.p90_ms * 1e3:.2f}':>17}"
            f"{s.cv * 100:>7.2f}{t.achieved_gbps or 0:>9.1f}{t.achieved_tflops or 0:>9.3f}{roof}")


def print_peaks(peaks: DevicePeaks | None, notes: list[str], out: TextIO) -> None:
    if peaks is None:
        print("device peaks: not measured (" + "; ".join(notes) + "); no roofline fractions", file=out)
        return
    compute = [f"{value:.1f} TFLOP/s {label}" for label, value in
               (("fp32", peaks.fp32_tflops), ("bf16 tensor", peaks.tensor_bf16_tflops)) if value]
    print(f"device peaks ({peaks.source}): {peaks.memory_gbps:.0f} GB/s copy (read + written)"
          + "".join(f", {c}" for c in compute) + "".join(f"; {n}" for n in peaks.notes + notes), file=out)


def print_vendor(report: VendorReport | None, targets: list[Target], out: TextIO) -> None:
    """The vendor library's table, then each timed kernel against it (vendor median / kernel median)."""
    if report is None:
        return
    print(f"\n== {report.name} (vendor baseline: timed and checked like a kernel, never a verdict)", file=out)
    for note in report.notes:
        print(f"   note: {note}", file=out)
    vendor_ms = report.medians_ms
    if not vendor_ms:
        return
    print(f"{'case':<54}" + TIMING_HEADER, file=out)
    for t in report.timing.cases:
        if t.case in vendor_ms:
            print(f"{t.case:<54}" + timing_cells(t), file=out)
    for target in targets:
        mine = {t.case: t.stats.median_ms for t in (target.timing.cases if target.timing else []) if t.stats}
        ratios = {case: vendor_ms[case] / mine[case] for case in vendor_ms if mine.get(case)}
        if ratios:
            each = ", ".join(f"{case} {ratio:.2f}x" for case, ratio in ratios.items())
            print(f"   {target.label} vs {report.name}: {each}; geometric mean "
                  f"{geometric_mean(list(ratios.values())):.2f}x ({report.name} time / kernel time: below 1 is slower)",
                  file=out)


def _write_json(path: Path, task: Task, targets: list[Target], gpu: dict | None, yardsticks: dict) -> None:
    document = {"task": task.name, "gpu": gpu, **yardsticks, "kernels": [{
        "label": t.label, "passed": t.passed,
        "compile": t.compiled.model_dump(mode="json") if t.compiled else None,
        "check": t.check.model_dump(mode="json") if t.check else None,
        "timing": t.timing.model_dump(mode="json") if t.timing else None} for t in targets]}
    path.write_text(json.dumps(document, indent=2))
