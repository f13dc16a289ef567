"""One approval's guard step on this host's GPU: its correctness, then its timing beside its baseline.

The referee's own executor (server/executor.py) on the approval's task copy: the kernel on the task's
recorded cases against the reference's outputs, on the holdout cases against the reference and the float64
oracle, and on fresh values against the oracle (server/replay_checks.py, every guard of the protocol on).
Then rounds on demand, each a timing job of the kernel and one of its baseline back to back, under one hold
of the GPU's host-wide lease (harness/gpu_lease.py); the order alternates round by round (kernel first, then
baseline first), so a drift of the GPU's pace within a round falls on both. A round answers the verdict's
input (guard/verdict.py TimingRound) per performance case, with NVML's readings around it merged: another
process, throttling and the lowest clock seen make the round inconclusive there.

A kernel that fails its own timing (an audited launch that does not match, unwritten outputs) is incorrect:
the round raises TimingRefused with the referee's reasons. The baseline's launches (and the task's own kernel's,
where that is what was approved) are not judged for their shape: a yardstick, as in a run. The step's cost is
kept (StepCost): the guard must cost at most twice its timing's GPU time.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

from pydantic import BaseModel

from guard.store import LoadedApproval
from guard.verdict import TimingRound
from harness.gpu_lease import LeaseWait, held
from harness.nvml import GpuState, GpuWatch
from harness.results import Reason
from harness.settings import CompiledKernel, TimingSettings
from harness.stats import summarize
from harness.task import load_task
from harness.task_model import LaunchSpec, Task
from harness.timing_shape import shape_waived, shape_waivers
from server import suspicion
from server.decision import CheckResult
from harness.gpus import Placement, list_gpus, placement_for
from server.executor import Executor, GpuExecutor
from server.replay_checks import compile_subject, correctness_checks
from server.replay_record import Subject

MakeExecutor = Callable[[Task, TimingSettings], Executor]
Say = Callable[[str], None]
LABELS = ("candidate", "baseline")


def local_executor(name: str, confine: bool = True, gpu: str | None = None) -> MakeExecutor:
    """GpuExecutors on this host's GPU (`gpu`, else one no serving run holds), their lease named for the approval.
    Each holds its GPU's serving claim from when it is made until it closes, so the next approval's step (or a
    server starting on the host) finds the GPU free again."""

    def make(task: Task, timing: TimingSettings) -> Executor:
        placement = placement_for(list_gpus(), gpu, f"guard {name}", None)
        try:
            return ClaimedExecutor(placement, task, timing, confine=confine, lease_what=f"guard {name}")
        except BaseException:
            if placement is not None:
                placement.release()
            raise

    return make


class ClaimedExecutor(GpuExecutor):
    """A GpuExecutor placed by harness/gpus.py `placement_for`: its GPU's serving claim is let go when it closes."""

    def __init__(self, placement: Placement | None, task: Task, timing: TimingSettings, **options):
        super().__init__(task, timing, gpu=placement.gpu if placement else None, **options)
        self.placement = placement

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.placement is not None:
                self.placement.release()


class TimingRefused(Exception):
    """The approved kernel (or its baseline) failed its own timing: the referee's reasons say why."""

    def __init__(self, label: str, reasons: list[Reason]):
        self.label, self.reasons = label, reasons
        super().__init__(f"the {label} failed its timing: " + "; ".join(
            f"{r.code.value} [{r.case}]: {r.detail}" for r in reasons))


class StepCost(BaseModel):
    """Where one approval's guard step spent its wall time, in seconds. `timing_s` is the timing jobs' own
    (every executor.time call, the GPU held for them); the rest is starting, compiling and checking."""

    start_s: float = 0.0
    checks_s: float = 0.0
    timing_s: float = 0.0
    total_s: float = 0.0
    rounds: int = 0

    @property
    def ratio(self) -> float | None:
        """The whole step over its timing: what the guard adds to the timing it needs anyway."""
        return self.total_s / self.timing_s if self.timing_s > 0 else None


@dataclass(frozen=True)
class GuardSubject:
    """What the step needs of an approval: its task copy, kernel, baseline and timing protocol."""

    name: str
    task: Task
    kernel: Subject
    baseline: Subject
    timing: TimingSettings

    @property
    def own_kernel(self) -> bool:
        """The approved kernel is the task's own (its baseline's source, options and launch), whatever attempt
        number it carries: a yardstick, exempt from the shape and the physical limit as in a run."""
        kernel, baseline = self.kernel, self.baseline
        return (kernel.source, kernel.options, kernel.launch) == (baseline.source, baseline.options, baseline.launch)


def subject_of(loaded: LoadedApproval) -> GuardSubject:
    """The step's subject from a verified approval (guard/store.py): its files are those it signed."""
    approval = loaded.approval

    def kernel(which) -> Subject:
        return Subject(which.attempt, which.file, loaded.source(which.file), tuple(which.options),
                       LaunchSpec.model_validate(which.launch))

    return GuardSubject(name=loaded.name, task=load_task(loaded.path("task")), kernel=kernel(approval.kernel),
                        baseline=kernel(approval.baseline), timing=TimingSettings.model_validate(approval.timing))


class GuardStep:
    """One approval measured on this host: `with GuardStep(...) as step:` starts the executor and compiles both
    kernels; `checks()` once, then `round()` as often as the verdict asks; the executor closes at the end."""

    def __init__(self, subject: GuardSubject, make_executor: MakeExecutor, say: Say | None = None):
        self.subject = subject
        self.say = say or (lambda message: None)
        self.make_executor = make_executor
        self.executor: Executor | None = None
        self.environment: dict = {}
        self.kernels: dict[str, CompiledKernel] = {}
        self.compile_failures: list[CheckResult] = []
        self.cost = StepCost()
        self.lease_waits: list[LeaseWait] = []
        self.stats: dict[str, dict[str, list[float]]] = {label: {} for label in LABELS}  # every round's samples
        # per kernel and case, the shape reasons of the yardstick timings taken as measured (one per round)
        self.waived: dict[str, dict[str, list[str]]] = {}
        self._began = time.monotonic()

    def __enter__(self) -> GuardStep:
        self._began = time.monotonic()
        # The oracle is imported from the approval's task copy: Python would add a __pycache__ to the store's
        # signed folder, and the next guard would refuse the approval as changed (a file added).
        self._wrote_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            self._start()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.executor is not None:
                self.executor.close()
        finally:
            sys.dont_write_bytecode = self._wrote_bytecode
            self.cost = self.cost.model_copy(update={"total_s": time.monotonic() - self._began})

    def _start(self) -> None:
        self.executor = self.make_executor(self.subject.task, self.subject.timing)
        self.environment = self.executor.start()
        lease = getattr(self.executor, "gpu_lease", None)
        if lease is not None:
            lease.listener, self.lease_waits = self.say, lease.waits
        for label, subject in zip(LABELS, (self.subject.kernel, self.subject.baseline)):
            compiled, failed = compile_subject(self.executor, subject, self.subject.task)  # and its arithmetic
            if compiled is not None:
                self.kernels[label] = compiled
            else:
                self.compile_failures.append(failed)
        self.cost = self.cost.model_copy(update={"start_s": time.monotonic() - self._began})

    @property
    def performance_cases(self) -> list[str]:
        return [c.name for c in self.subject.task.performance_cases]

    def checks(self) -> list[CheckResult]:
        """Every correctness check of the kernel (a compile failure is one); all must pass."""
        began = time.monotonic()
        kernel = self.kernels.get("candidate")
        found = list(self.compile_failures)
        if kernel is not None:
            self.say(f"{self.subject.name}: the kernel on its recorded cases")
            found += correctness_checks(self.executor, self.subject.task, kernel, [], self.subject.timing, self.say)
        self.cost = self.cost.model_copy(update={"checks_s": self.cost.checks_s + time.monotonic() - began})
        return found

    def round(self, only: list[str] | None = None) -> dict[str, TimingRound]:
        """One round: the kernel's and the baseline's timing jobs back to back under one hold of the GPU's lease,
        in the order this round's number gives; per performance case (those in `only`), both kernels' samples and
        NVML's readings."""
        if set(self.kernels) != set(LABELS):
            raise RuntimeError("a kernel that does not compile is not timed (checks() names it)")
        number = self.cost.rounds
        order = LABELS if number % 2 == 0 else LABELS[::-1]
        cases = [c for c in self.subject.task.performance_cases if only is None or c.name in only]
        reports, waived = {}, {label: {} for label in LABELS}
        with held(getattr(self.executor, "gpu_lease", None)):
            for label in order:
                began = time.monotonic()
                report = self.executor.time(self.kernels[label], cases)
                if label == "baseline" or self.subject.own_kernel:  # yardsticks, as in the run
                    waived[label] = shape_waivers(report)
                    for case, reasons in waived[label].items():
                        self.waived.setdefault(label, {}).setdefault(case, []).extend(reasons)
                    report = shape_waived(report)
                self.cost = self.cost.model_copy(update={"timing_s": self.cost.timing_s + time.monotonic() - began})
                if not report.passed:
                    raise TimingRefused(label, report.reasons or [r for c in report.cases for r in c.reasons])
                reports[label] = {c.case: c for c in report.cases}
        self.cost = self.cost.model_copy(update={"rounds": number + 1})
        rounds = {}
        for case in cases:
            timed = {label: reports[label][case.name] for label in LABELS}
            for label, timing in timed.items():
                self.stats[label].setdefault(case.name, []).extend(timing.samples_ms)
            watches = [GpuWatch.model_validate(reports[label][case.name].gpu) for label in order
                       if reports[label][case.name].gpu]
            rounds[case.name] = TimingRound(candidate_ms=timed["candidate"].samples_ms,
                                            baseline_ms=timed["baseline"].samples_ms, watch=merged_watch(watches),
                                            shape_waived=[label for label in LABELS if case.name in waived[label]])
        return rounds

    def physical_limit_checks(self) -> list[CheckResult]:
        """The kernel's medians over every round against this device's physical limits (server/suspicion.py); the
        task's own kernel is exempt, as in a run. A failed check per case beyond them."""
        samples = self.stats["candidate"]
        if self.subject.own_kernel or not samples:
            return []
        stats = {case: summarize(values).model_dump(mode="json") for case, values in samples.items() if values}
        mix = self.executor.compile(self.subject.kernel.source, self.subject.kernel.options).mix
        checks = suspicion.physical_limit_checks(self.subject.task, self.environment, stats, mix)
        return [CheckResult(name=f"physical limit {r.case}", kind="physical-limit", case=r.case, passed=False,
                            reasons=[f"{r.code.value}: {r.detail}"]) for r in suspicion.limit_reasons(checks)]


def merged_watch(watches: list[GpuWatch]) -> GpuWatch | None:
    """The readings around a round's jobs as one: every throttle reason and other process seen, and the lowest
    clock read while the GPU was busy (what guard/verdict.py round_trouble looks at)."""
    if not watches:
        return None
    readings = [state for watch in watches for state in (watch.before, watch.after)]
    throttle = sorted({reason for state in readings for reason in state.throttle})
    busy = [s for s in readings if s.sm_clock_mhz and "gpu_idle" not in s.throttle]
    lowest = min(busy, key=lambda s: s.sm_clock_mhz) if busy else readings[-1]
    first = readings[0].model_copy(update={"throttle": throttle})
    return GpuWatch(before=first, after=_busy(lowest), warnings=list(dict.fromkeys(w for x in watches for w in x.warnings)),
                    other_processes=sorted({p for watch in watches for p in watch.other_processes}))


def _busy(state: GpuState) -> GpuState:
    """A busy reading stays one: a merged 'after' never carries the idle flag of another reading."""
    return state.model_copy(update={"throttle": [r for r in state.throttle if r != "gpu_idle"]})
