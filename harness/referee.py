"""The referee: a task's inputs and expected outputs, and the correctness protocol, run from the trusted parent.

Inputs are made here, expected outputs come from the reference kernel in its own worker, and every
judgement (tolerance, races, guard bands, inputs, unwritten outputs) is made here from the raw bytes
a worker returns. The timing protocol is harness/timing_protocol.py.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from harness import jobs
from harness.call_limits import CallLimits
from harness.compare import Agreement, agreement
from harness.device_checks import DeviceChecks
from harness.drawn_inputs import case_draws, draw_key, host_draws
from harness.gpu_lease import GpuLease
from harness.job_deadlines import case_work, run_deadline_s, time_deadline_s
from harness.judging import integrity_reasons, reference_unwritten
from harness.nvml import Nvml
from harness.oracle import run_oracle
from harness.peaks import DevicePeaks
from harness.output_digest import OutputDigest, digest_on_host, digest_reasons, runs_agreement
from harness.results import CaseCheck, CheckReport, Reason, ReasonCode, TimingReport
from harness.settings import CompiledKernel, ReferenceFailed, TimingSettings, input_seed
from harness.task_model import DTYPES, Case, Task
from harness.task import make_inputs
from harness.timing_protocol import TimingProtocol
from harness.worker_calls import (STOPS_A_SEQUENCE, Refused, RunResult, call_worker, guard_bytes_of, launch_geometry,
                                  run_ahead)
from harness.worker_side import buffers
from harness.worker_side.device_heap import heap_refusal
from sandbox.pool import Worker, WorkerPool


class Referee(TimingProtocol, DeviceChecks):
    def __init__(self, task: Task, pool: WorkerPool, reference: CompiledKernel, settings: TimingSettings | None = None):
        self.task = task
        self.pool = pool
        self.reference = reference
        self.settings = settings or TimingSettings()
        self.peaks: DevicePeaks | None = None  # measured (harness/peaks.py): each timing's roofline fraction
        self.nvml: Nvml | None = None  # clocks, throttling and other processes read around each timing
        self.lease: GpuLease | None = None  # the GPU's host-wide lease, held around every timing job
        self.device: dict | None = None  # the worker's device facts: its peaks scale the jobs' deadlines
        # Inputs of a case's fixed seeds (its own and its rotation sets'), with their hashes: made once.
        self._inputs: dict[tuple[str, int], tuple[dict[str, np.ndarray], dict[str, str]]] = {}
        self._expected: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        # sha256 of timed outputs found right, by (case, input seed, output): the same bytes again need
        # neither a second trip from the worker nor a second comparison.
        self._verified: dict[tuple[str, int, str], set[str]] = {}
        self._poison_counts: dict[tuple[str, int], int] = {}  # elements of a right output equal to the poison
        # Inputs of secret seeds being made in the background (prepare()), by (case, seed); one batch at a time.
        self._preparing: dict[tuple[str, int], Future] = {}
        self._preparing_lock = threading.Lock()
        self._preparer: ThreadPoolExecutor | None = None
        self._comparer: ThreadPoolExecutor | None = None  # audited outputs compared while the GPU goes on
        self.limits: CallLimits | None = None  # the tool call in progress: its deadline and launch limits
        self._device_init()

    @contextmanager
    def within(self, limits: CallLimits) -> Iterator[None]:
        """Every job sent meanwhile (by any thread) ends by the call's deadline; the candidate's launches
        are limited per case (harness/call_limits.py)."""
        self.limits = limits
        try:
            yield
        finally:
            self.limits = None

    def _deadline(self):
        return self.limits.deadline if self.limits is not None else None

    def _launch_limit(self, worker: Worker, case: Case) -> float | None:
        """The candidates' worker only: the reference (and the vendor library beside it) is the task's own."""
        if self.limits is None or worker is not self.pool.candidate:
            return None
        return self.limits.launch_s.get(case.name)

    def run_deadline_s(self, case: Case) -> float:
        """A check job's deadline on this case: the settings' floor, or what its size needs (harness/job_deadlines.py)."""
        work = case_work(self.task, case, self.settings, self.device, self.judges_on_device(case),
                         self.draws(case) is not None)
        return run_deadline_s(work, self.settings)

    def time_deadline_s(self, case: Case) -> float:
        work = case_work(self.task, case, self.settings, self.device, self.judges_on_device(case),
                         self.draws(case) is not None)
        return time_deadline_s(work, self.settings)

    def _explained(self, failure: Reason) -> Reason:
        """A too_slow reason with the baseline's launch time its limit came from."""
        if failure.code is not ReasonCode.TOO_SLOW or self.limits is None:
            return failure
        return failure.model_copy(update={"detail": failure.detail + self.limits.too_slow_note(failure.case)})

    # -- expected outputs --------------------------------------------------------------------
    def expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        key = (case.name, seed)
        if key not in self._expected:
            outputs = self._run_reference(case, seed)
            if key in self._locked_trees:
                self.check_locked(case, seed, self.host_trees(case, seed, outputs))
            self._expected[key] = outputs
        return self._expected[key]

    def preload(self, case: Case, seed: int, outputs: dict[str, np.ndarray]) -> None:
        """Use outputs computed earlier (a resumed run's locked expected outputs)."""
        self._expected[(case.name, seed)] = outputs
        self._poison_counts.pop((case.name, seed), None)

    def oracle_expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        """The independent float64 oracle's answer, rounded to each output's dtype."""
        truth = run_oracle(self.task, case.dims, self.host_inputs(case, seed), case.name)
        return {p.name: truth[p.name].astype(DTYPES[p.dtype]) for p in self.task.output_params}

    def draws(self, case: Case) -> dict[str, dict] | None:
        """How the device draws the case's inputs, where it is that large (harness/drawn_inputs.py); else None."""
        return case_draws(self.task, case, self.settings.draw_inputs_from_bytes)

    def host_inputs(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        """The case's inputs for a seed as arrays on the host: those the jobs send, or those the device draws."""
        draws = self.draws(case)
        return self.inputs(case, seed)[0] if draws is None else host_draws(self.task, case, seed, draws)

    def inputs(self, case: Case, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The inputs a job sends for a case and seed, and their hashes (none where the device draws them). Those
        of the case's fixed seeds are kept; a secret seed's are made afresh (and used once), or taken from prepare()."""
        if self.draws(case) is not None:
            return {}, {}
        key = (case.name, seed)
        if key in self._inputs:
            return self._inputs[key]
        with self._preparing_lock:
            prepared = self._preparing.pop(key, None)
        made = prepared.result() if prepared is not None else self._make_inputs(case, seed)
        if seed in {input_seed(case, i) for i in range(self.settings.rotation_sets)}:
            self._inputs[key] = made
        return made

    def prepare(self, cases: list[Case], seeds: dict[str, int]) -> None:
        """Start making the inputs of `cases` for their `seeds` on a background thread, so that a later
        check with those seeds finds them made (an attempt's secret seeds, while its visible cases are
        checked). Inputs prepared earlier and not used are dropped: one attempt's at a time."""
        with self._preparing_lock:
            for future in self._preparing.values():
                future.cancel()
            if self._preparer is None:
                self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inputs-ahead")
            self._preparing = {(case.name, seeds[case.name]): self._preparer.submit(self._make_inputs, case,
                                                                                    seeds[case.name])
                               for case in cases if case.name in seeds and self.draws(case) is None}

    def _make_inputs(self, case: Case, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        inputs = make_inputs(self.task, case.dims, seed)
        return inputs, dict(zip(inputs, buffers.digests(list(inputs.values()))))

    def _run_reference(self, case: Case, seed: int, made=None) -> dict[str, np.ndarray]:
        inputs, hashes = made or self.inputs(case, seed)
        result = self._run(self.pool.reference, self.reference, case, inputs, hashes, seed=seed)
        if result.failure is not None:
            raise ReferenceFailed(case.name, f"{result.failure.code.value}: {result.failure.detail}")
        problems = result.integrity.guard_violations + [f"modified input {n}" for n in result.integrity.modified_inputs]
        if problems:
            raise ReferenceFailed(case.name, "; ".join(problems))
        first, second = result.runs
        for spec in result.layout.outputs:
            unwritten = reference_unwritten(spec.name, first[spec.name], second[spec.name])
            if unwritten is not None:
                raise ReferenceFailed(case.name, unwritten)
            tol = self.task.tolerances[spec.name]
            if agreement(first[spec.name], second[spec.name], tol.rtol, tol.atol) is Agreement.DIFFERS:
                raise ReferenceFailed(case.name, f"it is not deterministic: two runs on the same inputs differ "
                                                 f"beyond the tolerance in {spec.name}")
        return first

    # -- correctness ---------------------------------------------------------------------------
    def check(self, kernel: CompiledKernel, cases: list[Case], seeds: dict[str, int] | None = None,
              against_oracle: bool = False) -> CheckReport:
        """Every case twice with different poison; stops early after a fault or a timeout. The next
        case runs on the GPU while this one's outputs are compared (one case ahead, no more)."""
        def produce(put, stopped):
            for case in cases:
                if stopped():
                    return
                seed = (seeds or {}).get(case.name, case.seed)
                expected, result = self._expected_and_run(kernel, case, seed, against_oracle)
                put((case, expected, result))
                if result.failure is not None and result.failure.code in STOPS_A_SEQUENCE:
                    return

        results = []
        for case, expected, result in run_ahead(produce):
            results.append(self._judge_check(case, expected, result))
            if any(r.code in STOPS_A_SEQUENCE for r in results[-1].reasons):
                break
        passed = len(results) == len(cases) and all(r.passed for r in results)
        return CheckReport(passed=passed, cases=results)

    def _expected_and_run(self, kernel: CompiledKernel, case: Case, seed: int, against_oracle: bool):
        """The outputs to compare with and the candidate's raw run. A secret seed's reference run (in
        the reference worker) and the candidate's (in its own) go at the same time."""
        if not against_oracle and self.judges_on_device(case):
            result = self.check_on_device(kernel, case, seed)
            if result is not None:
                return None, result  # judged: the digests are in the result
        made = self.inputs(case, seed)
        if against_oracle:
            return self.oracle_expected(case, seed), self._run(self.pool.candidate, kernel, case, *made, seed=seed)
        if seed == case.seed:
            return self.expected(case, seed), self._run(self.pool.candidate, kernel, case, *made, seed=seed)
        # A secret seed is used once: its outputs are not kept for the rest of the run.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference") as side:
            reference = side.submit(self._run_reference, case, seed, made)
            result = self._run(self.pool.candidate, kernel, case, *made, seed=seed)
            return reference.result(), result

    def _judge_check(self, case: Case, expected: dict[str, np.ndarray], result: "RunResult") -> CaseCheck:
        if result.failure is not None:
            return CaseCheck(case=case.name, role=case.role, passed=False, reasons=[result.failure])
        if result.digests is not None:  # judged on the device (harness/device_checks.py)
            return case_check(case, result.digests, integrity_reasons(result.integrity, case.name))
        digests = [digest_on_host(spec.name, expected[spec.name], result.runs[0][spec.name],
                                  result.runs[1][spec.name], *self._tolerance(spec.name))
                   for spec in result.layout.outputs]
        return case_check(case, digests, integrity_reasons(result.integrity, case.name))

    def _tolerance(self, output: str) -> tuple[float, float]:
        tol = self.task.tolerances[output]
        return tol.rtol, tol.atol

    def _run(self, worker: Worker, kernel: CompiledKernel, case: Case, inputs: dict[str, np.ndarray],
             hashes: dict[str, str] | None = None, on_device: dict | None = None, seed: int | None = None) -> "RunResult":
        """The kernel once per poison. `on_device`: header fields that leave the outputs on the device
        (harness/device_checks.py); the answer then comes back in the result instead of the outputs. `seed`:
        the input seed, by which a large case's inputs are drawn on the device (harness/drawn_inputs.py)."""
        draws = self.draws(case)
        drawn = jobs.FreshDraws(key=draw_key(seed), draws=draws) if draws is not None else None
        if draws is not None and seed is None:
            raise ValueError(f"case {case.name} draws its inputs on the device: a run needs its seed")
        layout = jobs.Layout.for_case(self.task, case.dims)
        geometry, failure = launch_geometry(kernel, case)
        failure = self._heap_failure(kernel, case) or failure
        if failure is not None:
            return RunResult(layout, failure=failure)
        guard_seed = secrets.randbits(62)
        out_bytes = 0 if on_device else sum(a.nbytes for a in layout.outputs) * len(buffers.POISON_BYTES)
        limit = self._launch_limit(worker, case)

        def build(resident: frozenset[str]):
            header, blobs = jobs.make_run_job(kernel.cubin, kernel.symbol, layout, geometry, inputs,
                                              buffers.POISON_BYTES, guard_seed, hashes, resident, limit, drawn)
            return {**header, **(on_device or {})}, blobs

        answer, answer_blobs, failure = call_worker(worker, build, self.run_deadline_s(case),
                                                   out_bytes + guard_bytes_of(layout, 1), case.name, self._deadline())
        if failure is not None:
            return RunResult(layout, failure=self._explained(failure))
        if on_device:
            integrity = drawn_integrity(answer, jobs.check_integrity(answer, answer_blobs, layout, guard_seed, [inputs],
                                                                     [hashes]), draws)
            return RunResult(layout, integrity=integrity, answer=answer)
        n = len(layout.outputs)
        outputs, guards = jobs.unpack_outputs(answer, answer_blobs, buffers.run_slots(len(buffers.POISON_BYTES), n), {})
        runs = [jobs.read_arrays(outputs[i * n:(i + 1) * n], layout.outputs) for i in range(len(buffers.POISON_BYTES))]
        integrity = drawn_integrity(answer, jobs.check_integrity(answer, guards, layout, guard_seed, [inputs], [hashes]),
                                    draws)
        return RunResult(layout, runs=runs, integrity=integrity)

    def run_on(self, worker: Worker, kernel: CompiledKernel, case: Case) -> "RunResult":
        """The kernel once on the case's first fixed inputs, in the given worker (profile_kernel's)."""
        seed = input_seed(case, 0)
        return self._run(worker, kernel, case, *self.inputs(case, seed), seed=seed)

    # -- timing --------------------------------------------------------------------------------
    def time(self, kernel: CompiledKernel, cases: list[Case]) -> TimingReport:
        def kernel_job(case: Case, layout: jobs.Layout, input_sets: list, timing: dict):
            geometry, failure = launch_geometry(kernel, case)
            failure = self._heap_failure(kernel, case) or failure
            if failure is not None:
                raise Refused(failure)
            return jobs.make_time_job(kernel.cubin, kernel.symbol, layout, geometry, input_sets, **timing)

        return self._time_cases(cases, kernel_job, self.pool.candidate)

    def _heap_failure(self, kernel: CompiledKernel, case: Case) -> Reason | None:
        """A kernel that calls the device heap where the task does not allow it runs nowhere (checks, timings,
        profiles): refused before its job is sent (harness/worker_side/device_heap.py)."""
        refusal = heap_refusal(kernel.cubin, self.task.device_heap)
        return None if refusal is None else Reason(code=ReasonCode.DEVICE_HEAP, case=case.name, detail=refusal)

    def time_vendor(self, cases: list[Case], call_for: Callable[[Case], dict]) -> TimingReport:
        """A vendor library call (harness/vendor_yardstick.py) timed and re-checked exactly like a kernel.

        It runs in the reference worker: trusted code only, so the library's handle and workspace
        never share a context with a candidate. Raises Unavailable where the library cannot load.
        """
        def vendor_job(case: Case, layout: jobs.Layout, input_sets: list, timing: dict):
            return jobs.make_vendor_time_job(call_for(case), layout, input_sets, **timing)

        return self._time_cases(cases, vendor_job, self.pool.reference)


def case_check(case: Case, digests: list[OutputDigest], reasons: list[Reason]) -> CaseCheck:
    """A case's check from its outputs' digests, after the integrity reasons (guard bands, inputs)."""
    reasons, warnings = list(reasons), []
    for digest in digests:
        found, noted = digest_reasons(case.name, digest)
        reasons += found
        warnings += noted
    judged_on = "device" if digests and all(d.judged_on == "device" for d in digests) else "host"
    return CaseCheck(case=case.name, role=case.role, passed=not reasons, outputs=[d.check for d in digests],
                     agreement=runs_agreement(digests).value, reasons=reasons, warnings=warnings, judged_on=judged_on)


def drawn_integrity(answer: dict, integrity: jobs.Integrity, draws: dict[str, dict] | None) -> jobs.Integrity:
    """A run's integrity with its drawn inputs counted in: one whose elements no longer hold their draw was
    changed by the kernel."""
    if draws is None:
        return integrity
    changed = answer.get("changed_inputs")
    if not isinstance(changed, dict) or set(changed) != set(draws):
        raise jobs.AnswerError("the run's answer does not say which drawn inputs changed")
    integrity.modified_inputs = sorted(set(integrity.modified_inputs) | {n for n, count in changed.items() if count})
    return integrity
