"""The correctness and timing protocols, run from the trusted parent.

Inputs are made here, expected outputs come from the reference kernel in its own worker, and every
judgement (tolerance, races, guard bands, inputs, unwritten or stale timed outputs) is made here
from the raw bytes a worker returns.
"""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel

from harness import fresh_inputs, jobs
from harness.compare import Agreement, agreement, compare_output, raw_words
from harness.nvml import GpuWatch, Nvml, judge
from harness.stats import StoppingRule, geometric_mean, summarize
from harness.oracle import run_oracle
from harness.peaks import DevicePeaks, roofline_fraction, roofline_ms
from harness.task import DTYPES, INTEGER_DTYPES, Case, LaunchSpec, Task, make_inputs
from harness.verdict import CaseCheck, CaseTiming, CheckReport, Reason, ReasonCode, TimingReport
from sandbox.pool import JobTimeout, Worker, WorkerCrashed, WorkerPool


class Settings(BaseModel):
    warmups: int = 10
    iterations: int = 100
    rotation_sets: int = 4
    cold_l2: bool = True
    # Audited launches per job: max(min_checked_launches, checked_fraction x iterations). Each one costs a
    # reference launch on its inputs and a full comparison of its outputs in the parent.
    checked_fraction: float = 0.03
    min_checked_launches: int = 3
    run_deadline_s: float = 10.0
    time_deadline_s: float = 45.0
    # Noise-adaptive sampling: after the first `iterations` launches, more batches of `iterations`
    # follow until the median's 95% interval is within +-noise_target of it, or max_iterations.
    noise_target: float = 0.005
    max_iterations: int = 400
    # "kernel": each launch's own time on the GPU (CUPTI, harness/kernel_clock.py), where the worker
    # has it, else its event pair; "events": the event pairs alone.
    clock: Literal["kernel", "events"] = "kernel"
    # True: every warm-up and timed launch draws its inputs anew on the device from a secret key, and the
    # checked launches are audited against the reference's output for their inputs (harness/fresh_inputs.py).
    # False: launches rotate the `rotation_sets` fixed input sets (the protocol before fresh inputs; the bench
    # times both).
    fresh_inputs: bool = True

    @property
    def checked_launches(self) -> int:
        """How many timed launches have their output re-checked (audited, with fresh inputs)."""
        return max(self.min_checked_launches, round(self.checked_fraction * self.iterations))


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel ready to run: CUBIN, its symbol, and how to launch it."""

    label: str
    cubin: bytes
    symbol: str
    launch: LaunchSpec


class ReferenceFailed(RuntimeError):
    """The task's reference kernel failed: the task, not a candidate, is broken."""


class Unavailable(RuntimeError):
    """The worker cannot do this job: an optional library (cuBLAS) does not load there."""


def input_seed(case: Case, set_index: int, base_seed: int | None = None) -> int:
    """Set 0 uses the case's seed (or a fresh one); the rotation sets derive theirs from it."""
    seed = case.seed if base_seed is None else base_seed
    if set_index == 0:
        return seed
    return int(np.random.SeedSequence([seed, 0x5EED, set_index]).generate_state(1, np.uint64)[0] >> 1)


class Referee:
    def __init__(self, task: Task, pool: WorkerPool, reference: Kernel, settings: Settings | None = None):
        self.task = task
        self.pool = pool
        self.reference = reference
        self.settings = settings or Settings()
        self.peaks: DevicePeaks | None = None  # measured (harness/peaks.py): each timing's roofline fraction
        self.nvml: Nvml | None = None  # clocks, throttling and other processes read around each timing
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

    # -- expected outputs --------------------------------------------------------------------
    def expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        key = (case.name, seed)
        if key not in self._expected:
            self._expected[key] = self._run_reference(case, seed)
        return self._expected[key]

    def preload(self, case: Case, seed: int, outputs: dict[str, np.ndarray]) -> None:
        """Use outputs computed earlier (a resumed run's locked expected outputs)."""
        self._expected[(case.name, seed)] = outputs
        self._poison_counts.pop((case.name, seed), None)

    def oracle_expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        """The independent float64 oracle's answer, rounded to each output's dtype."""
        truth = run_oracle(self.task, case.dims, self.inputs(case, seed)[0])
        return {p.name: truth[p.name].astype(DTYPES[p.dtype]) for p in self.task.output_params}

    def inputs(self, case: Case, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """A case's inputs for a seed, and their hashes. Those of the case's fixed seeds are kept; a
        secret seed's are made afresh (and used once), or taken from prepare()."""
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
                               for case in cases if case.name in seeds}

    def _make_inputs(self, case: Case, seed: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        inputs = make_inputs(self.task, case.dims, seed)
        return inputs, dict(zip(inputs, jobs.digests(list(inputs.values()))))

    def _run_reference(self, case: Case, seed: int, made=None) -> dict[str, np.ndarray]:
        inputs, hashes = made or self.inputs(case, seed)
        result = self._run(self.pool.reference, self.reference, case, inputs, hashes)
        if result.failure is not None:
            raise ReferenceFailed(f"reference kernel failed on case {case.name}: {result.failure.detail}")
        problems = result.integrity.guard_violations + [f"modified input {n}" for n in result.integrity.modified_inputs]
        if problems:
            raise ReferenceFailed(f"reference kernel on case {case.name}: {'; '.join(problems)}")
        first, second = result.runs
        for spec in result.layout.outputs:
            tol = self.task.tolerances[spec.name]
            if agreement(first[spec.name], second[spec.name], tol.rtol, tol.atol) is Agreement.DIFFERS:
                raise ReferenceFailed(f"reference kernel is not deterministic on case {case.name} ({spec.name})")
        return first

    # -- correctness ---------------------------------------------------------------------------
    def check(self, kernel: Kernel, cases: list[Case], seeds: dict[str, int] | None = None,
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
                if result.failure is not None and result.failure.code in _STOPS_A_CHECK:
                    return

        results = []
        for case, expected, result in run_ahead(produce):
            results.append(self._judge_check(case, expected, result))
            if any(r.code in _STOPS_A_CHECK for r in results[-1].reasons):
                break
        passed = len(results) == len(cases) and all(r.passed for r in results)
        return CheckReport(passed=passed, cases=results)

    def _expected_and_run(self, kernel: Kernel, case: Case, seed: int, against_oracle: bool):
        """The outputs to compare with and the candidate's raw run. A secret seed's reference run (in
        the reference worker) and the candidate's (in its own) go at the same time."""
        made = self.inputs(case, seed)
        if against_oracle:
            return self.oracle_expected(case, seed), self._run(self.pool.candidate, kernel, case, *made)
        if seed == case.seed:
            return self.expected(case, seed), self._run(self.pool.candidate, kernel, case, *made)
        # A secret seed is used once: its outputs are not kept for the rest of the run.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference") as side:
            reference = side.submit(self._run_reference, case, seed, made)
            result = self._run(self.pool.candidate, kernel, case, *made)
            return reference.result(), result

    def _judge_check(self, case: Case, expected: dict[str, np.ndarray], result: "_RunResult") -> CaseCheck:
        if result.failure is not None:
            return CaseCheck(case=case.name, role=case.role, passed=False, reasons=[result.failure])
        reasons = _integrity_reasons(result.integrity, case.name)
        outputs, warnings, verdict = [], [], Agreement.IDENTICAL
        for spec in result.layout.outputs:
            tol = self.task.tolerances[spec.name]
            first, second = result.runs[0][spec.name], result.runs[1][spec.name]
            check = compare_output(spec.name, expected[spec.name], first, tol.rtol, tol.atol)
            outputs.append(check)
            if check.warning:
                warnings.append(f"{spec.name}: {check.warning}")
            if not check.passed:
                reasons.append(Reason(code=ReasonCode.MISMATCH, case=case.name, detail=_mismatch_detail(check)))
            unwritten = _still_poisoned(first, second)
            if unwritten.any():
                first_at = [int(i) for i in np.unravel_index(np.argmax(unwritten), first.shape)]
                reasons.append(Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case.name, detail=(
                    f"{spec.name}: {int(unwritten.sum())} of {unwritten.size} elements were never written "
                    f"(they still hold the poison; first at {first_at})")))
            pair = agreement(*((first[~unwritten], second[~unwritten]) if unwritten.any() else (first, second)),
                             tol.rtol, tol.atol)
            if pair is Agreement.DIFFERS:
                verdict = pair
                reasons.append(Reason(code=ReasonCode.RACE, case=case.name, detail=(
                    f"{spec.name}: two runs on the same inputs disagree beyond tolerance "
                    "(a race or a read of uninitialized memory)")))
            elif pair is Agreement.WITHIN_TOLERANCE and verdict is Agreement.IDENTICAL:
                verdict = pair
                warnings.append(f"{spec.name}: nondeterministic (runs differ within tolerance)")
        return CaseCheck(case=case.name, role=case.role, passed=not reasons, outputs=outputs,
                         agreement=verdict.value, reasons=reasons, warnings=warnings)

    def _run(self, worker: Worker, kernel: Kernel, case: Case, inputs: dict[str, np.ndarray],
             hashes: dict[str, str] | None = None) -> "_RunResult":
        layout = jobs.Layout.for_case(self.task, case.dims)
        geometry, failure = _geometry(kernel, case)
        if failure is not None:
            return _RunResult(layout, failure=failure)
        guard_seed = secrets.randbits(62)
        out_bytes = sum(a.nbytes for a in layout.outputs) * len(jobs.POISON_BYTES)

        def build(resident: frozenset[str]):
            return jobs.run_job(kernel.cubin, kernel.symbol, layout, geometry, inputs, jobs.POISON_BYTES,
                                guard_seed, hashes, resident)

        answer, answer_blobs, failure = self._call(worker, build, self.settings.run_deadline_s,
                                                   out_bytes + _guard_bytes(layout, 1), case.name)
        if failure is not None:
            return _RunResult(layout, failure=failure)
        n = len(layout.outputs)
        outputs, guards = jobs.unpack_outputs(answer, answer_blobs, jobs.run_slots(len(jobs.POISON_BYTES), n), {})
        runs = [jobs.read_arrays(outputs[i * n:(i + 1) * n], layout.outputs) for i in range(len(jobs.POISON_BYTES))]
        integrity = jobs.check_integrity(answer, guards, layout, guard_seed, [inputs], [hashes])
        return _RunResult(layout, runs=runs, integrity=integrity)

    def _call(self, worker: Worker, build: Callable[[frozenset[str]], tuple[dict, list]], deadline_s: float,
              max_bytes: int, case: str):
        """(answer, blobs, None) or (None, None, the candidate's failure as a Reason).
        `build(resident)` makes the job, leaving out the inputs the worker says it holds; if it no
        longer holds one, the job goes again with all of them."""
        header, blobs = build(worker.resident_inputs)
        try:
            answer, answer_blobs = worker.call(header, blobs, deadline_s, max_bytes + (1 << 20))
            if answer.get("status") == "resident_missing":
                worker.resident_inputs = frozenset()
                header, blobs = build(worker.resident_inputs)
                answer, answer_blobs = worker.call(header, blobs, deadline_s, max_bytes + (1 << 20))
        except JobTimeout:
            worker.resident_inputs = frozenset()
            return None, None, Reason(code=ReasonCode.TIMEOUT, case=case,
                                      detail=f"still running after {deadline_s:g} s; the worker was killed")
        except WorkerCrashed as exc:
            worker.resident_inputs = frozenset()
            return None, None, Reason(code=ReasonCode.WORKER_CRASHED, case=case, detail=str(exc))
        worker.resident_inputs = frozenset(answer.get("resident_inputs") or ())
        return self._read_answer(answer, answer_blobs, case)

    def _read_answer(self, answer: dict, answer_blobs: list, case: str):
        status = answer.get("status")
        if status == "ok":
            return answer, answer_blobs, None
        detail = f"{answer.get('error')}: {answer.get('detail')}"
        if status == "fault":
            return None, None, Reason(code=ReasonCode.CUDA_FAULT, case=case, detail=detail)
        if status == "launch_error":
            return None, None, Reason(code=ReasonCode.LAUNCH_ERROR, case=case, detail=detail)
        if status == "out_of_memory":
            return None, None, Reason(code=ReasonCode.OUT_OF_MEMORY, case=case, detail=detail)
        if status == "unavailable":
            raise Unavailable(detail)
        raise RuntimeError(f"worker error on case {case}: {detail}")

    # -- timing --------------------------------------------------------------------------------
    def time(self, kernel: Kernel, cases: list[Case]) -> TimingReport:
        def kernel_job(case: Case, layout: jobs.Layout, input_sets: list, timing: dict):
            geometry, failure = _geometry(kernel, case)
            if failure is not None:
                raise _Refused(failure)
            return jobs.time_job(kernel.cubin, kernel.symbol, layout, geometry, input_sets, **timing)

        return self._time_cases(cases, kernel_job, self.pool.candidate)

    def time_vendor(self, cases: list[Case], call_for: Callable[[Case], dict]) -> TimingReport:
        """A vendor library call (harness/baselines.py) timed and re-checked exactly like a kernel.

        It runs in the reference worker: trusted code only, so the library's handle and workspace
        never share a context with a candidate. Raises Unavailable where the library cannot load.
        """
        def vendor_job(case: Case, layout: jobs.Layout, input_sets: list, timing: dict):
            return jobs.vendor_time_job(call_for(case), layout, input_sets, **timing)

        return self._time_cases(cases, vendor_job, self.pool.reference)

    def _time_cases(self, cases: list[Case], make_job, worker: Worker) -> TimingReport:
        """Each case in turn. The audited outputs of fresh-input timings are compared on other threads
        while the next jobs run on the GPU; every comparison is done before this returns."""
        audits: list[tuple[str, Future]] = []  # (case, its comparison under way)
        timings = [self._time_case(case, make_job, worker, audits) for case in cases]
        timings = [_with_audits(t, [f for name, f in audits if name == t.case]) for t in timings]
        passed = all(t.passed for t in timings)
        score = geometric_mean([t.stats.median_ms for t in timings]) if passed and timings else None
        return TimingReport(passed=passed, cases=timings, score_ms=score)

    def _time_case(self, case: Case, make_job, worker: Worker, audits: list[tuple[str, Future]]) -> CaseTiming:
        """Batches of timed launches until the median is known to within the noise target (or the
        cap); every batch is judged on its own (fresh re-checked launches, fresh guard seed), then
        the samples are merged. The GPU's clocks, throttling and other users are read around it."""
        s = self.settings
        timed = self._timed_case(case)
        rule = StoppingRule(min_samples=s.iterations, max_samples=max(s.max_iterations, s.iterations),
                            target_rel_halfwidth=s.noise_target)
        before = self.nvml.read() if self.nvml else None
        batches: list[CaseTiming] = []
        while True:
            timing = self._time_batch(timed, make_job, worker, audits)
            if not timing.passed:
                return timing.model_copy(update={"batches": len(batches) + 1})
            batches.append(timing)
            for sample in timing.samples_ms:
                rule.add(sample)
            if rule.is_finished() or len(rule.samples) + s.iterations > rule.max_samples:
                break
        watch = judge(before, self.nvml.read(), self._our_pids()) if self.nvml and before else None
        return self._merged(case, batches, rule, watch)

    def _timed_case(self, case: Case) -> _TimedCase:
        """What every batch of a case's timing shares. The input sets (and their hashes) are fixed per
        case and seed: made once, they stay out of every later timing's wall time."""
        layout = jobs.Layout.for_case(self.task, case.dims)
        if self.settings.fresh_inputs:
            return self._fresh_case(case, layout)
        seeds = [input_seed(case, i) for i in range(self.settings.rotation_sets)]
        made = [self.inputs(case, seed) for seed in seeds]
        expected_sets = [self.expected(case, seed) for seed in seeds]
        verified = {f"{s}/{j}": self._verified.setdefault((case.name, seed, spec.name), set())
                    for s, seed in enumerate(seeds) for j, spec in enumerate(layout.outputs)}
        return _TimedCase(
            case=case, layout=layout, expected_sets=expected_sets,
            input_sets=[inputs for inputs, _ in made], sent_hashes=[hashes for _, hashes in made],
            poison_counts=[self._poison_count(case, seed, layout) for seed in seeds],
            verified=verified)

    def _fresh_case(self, case: Case, layout: jobs.Layout) -> _TimedCase:
        """Fresh inputs: the drawn inputs' generators, and the inputs that cannot be drawn (pinned .npy
        files) from the case's own seed, the same in every set."""
        draws = {p.name: fresh_inputs.draw_spec(g.kind, p.dtype, g.low, g.high, g.mean, g.std)
                 for p in self.task.input_params if (g := self.task.inputs[p.name]).kind != "npy"}
        inputs, hashes = self.inputs(case, case.seed)
        fixed = {name: array for name, array in inputs.items() if name not in draws}
        fixed_hashes = {name: hashes[name] for name in fixed}
        sets = self.settings.rotation_sets
        # Whether a right output can hold the timing poison (all bits set: a NaN no arithmetic makes, but -1
        # or the maximum of an integer): then only the audited launches, whose right outputs are known, are
        # judged by the elements still holding it.
        poison_is_a_value = (any(spec.dtype in INTEGER_DTYPES for spec in layout.outputs)
                             or self._poison_count(case, case.seed, layout) > 0)
        return _TimedCase(case=case, layout=layout, expected_sets=[], input_sets=[fixed] * sets,
                          sent_hashes=[fixed_hashes] * sets, poison_counts=[], draws=draws,
                          poison_is_a_value=poison_is_a_value)

    def _reference_draws(self, timed: _TimedCase, fresh: jobs.FreshDraws, launches: list[int]) -> list[dict]:
        """The reference's outputs for the inputs that the given launches of a fresh time job draw, in order:
        computed in the reference worker on the GPU, before the timing (never beside it)."""
        case, layout = timed.case, timed.layout
        geometry, failure = _geometry(self.reference, case)
        if failure is not None:
            raise ReferenceFailed(f"reference kernel on case {case.name}: {failure.detail}")
        guard_seed = secrets.randbits(62)

        def build(resident: frozenset[str]):
            return jobs.draw_run_job(self.reference.cubin, self.reference.symbol, layout, geometry,
                                     timed.input_sets[0], fresh, launches, guard_seed, timed.sent_hashes[0], resident)

        out_bytes = sum(a.nbytes for a in layout.outputs) * len(launches)
        answer, blobs, failure = self._call(self.pool.reference, build, self.settings.run_deadline_s,
                                            out_bytes + _guard_bytes(layout, 1), case.name)
        if failure is not None:
            raise ReferenceFailed(f"reference kernel failed on case {case.name} (audited inputs): {failure.detail}")
        n = len(layout.outputs)
        outputs, _ = jobs.unpack_outputs(answer, blobs, jobs.audit_slots(launches, n), {})
        return [jobs.read_arrays(outputs[k * n:(k + 1) * n], layout.outputs) for k in range(len(launches))]

    def _poison_count(self, case: Case, seed: int, layout: jobs.Layout) -> int:
        key = (case.name, seed)
        if key not in self._poison_counts:
            self._poison_counts[key] = _poison_count(self.expected(case, seed), layout, jobs.TIMING_POISON)
        return self._poison_counts[key]

    def _our_pids(self) -> list[int]:
        return [w.pid for w in (self.pool.candidate, self.pool.reference) if w.alive]

    def _time_batch(self, timed: _TimedCase, make_job, worker: Worker,
                    audits: list[tuple[str, Future]]) -> CaseTiming:
        """`make_job(case, layout, input_sets, timing)` gives (header, blobs), or raises _Refused."""
        s, case, layout = self.settings, timed.case, timed.layout
        checked = _secret_subset(s.iterations, s.checked_launches)
        guard_seed = secrets.randbits(62)
        timing = {"warmups": s.warmups, "iterations": s.iterations, "cold_l2": s.cold_l2,
                  "checked_launches": checked, "guard_seed": guard_seed, "clock": s.clock, "hashes": timed.sent_hashes,
                  "known_outputs": {slot: sorted(hashes) for slot, hashes in timed.verified.items() if hashes}}
        sets = len(timed.input_sets)
        out_bytes = sum(a.nbytes for a in layout.outputs) * (len(checked) + sets)
        expected = None
        if timed.draws is not None:
            fresh = jobs.FreshDraws(key=secrets.randbits(64), draws=timed.draws)
            timing.update(fresh=fresh, known_outputs={}, hashes=timed.sent_hashes)
            expected = self._reference_draws(timed, fresh, [s.warmups + i for i in checked])
        built: list[dict] = []

        def build(resident: frozenset[str]):
            header, blobs = make_job(case, layout, timed.input_sets, {**timing, "resident": resident})
            built[:] = [header]
            return header, blobs

        try:
            answer, blobs_back, failure = self._call(worker, build, s.time_deadline_s,
                                                     out_bytes + _guard_bytes(layout, sets), case.name)
        except _Refused as refused:
            failure = refused.reason
        if failure is not None:
            return CaseTiming(case=case.name, passed=False, reasons=[failure])
        if expected is not None:
            return self._judge_fresh_timing(timed, answer, blobs_back, checked, guard_seed, expected, built[0], audits)
        return self._judge_timing(timed, answer, blobs_back, checked, guard_seed)

    def _merged(self, case: Case, batches: list[CaseTiming], rule: StoppingRule, watch: GpuWatch | None) -> CaseTiming:
        if len({b.clock for b in batches}) > 1:
            raise jobs.AnswerError(f"case {case.name}: the worker's timings changed clock between batches")
        samples = [x for b in batches for x in b.samples_ms]
        events = [x for b in batches for x in b.event_samples_ms] if batches[0].clock == "kernel" else None
        stats = summarize(samples)
        warnings = list(dict.fromkeys(w for b in batches for w in b.warnings))
        if watch is not None:
            warnings += watch.warnings
        noise = rule.rel_halfwidth()
        if noise > self.settings.noise_target:
            warnings.append(f"the median is known to +-{noise:.2%} after {len(samples)} launches, "
                            f"short of the +-{self.settings.noise_target:.2%} target")
        kept_up = [b.host_kept_up for b in batches if b.host_kept_up is not None]
        busy = [b.gpu_busy_ms for b in batches]
        return batches[-1].model_copy(update={
            "gpu_busy_ms": sum(busy) if None not in busy else None,
            "stats": stats, "samples_ms": samples, "launches": len(samples), "event_samples_ms": events,
            "event_median_ms": summarize(events).median_ms if events else None,
            "checked_launches": sum(b.checked_launches for b in batches),
            "audited_launches": sum(b.audited_launches for b in batches),
            "unwritten_launches": sum(b.unwritten_launches for b in batches),
            "host_kept_up": all(kept_up) if kept_up else None,
            "warnings": warnings, "batches": len(batches), "noise": noise,
            "gpu": watch.model_dump(mode="json") if watch else None, **self._rates(case, stats)})

    def _rates(self, case: Case, stats) -> dict:
        """Achieved GB/s and TFLOP/s, the roofline bound and the fraction of it, at the median."""
        seconds = stats.median_ms * 1e-3
        flops, moved = self.task.flops(case.dims), self.task.bytes_moved(case.dims)
        bound_ms = roofline_ms(self.peaks, moved, flops, self.task.cost.compute)
        return {"achieved_gbps": moved / seconds / 1e9 if moved else None,
                "achieved_tflops": flops / seconds / 1e12 if flops else None,
                "roofline_ms": bound_ms, "roofline_fraction": roofline_fraction(bound_ms, stats.median_ms)}

    def _judge_timing(self, timed: _TimedCase, answer, blobs, checked, guard_seed) -> CaseTiming:
        case, layout = timed.case, timed.layout
        n_out, sets = len(layout.outputs), len(timed.input_sets)
        clock, samples, events = _clocked_samples(answer, self.settings.iterations)
        unwritten = answer.get("unwritten", [])
        if len(unwritten) != self.settings.iterations:
            raise jobs.AnswerError("timing answer has the wrong number of samples")
        outputs, guards = jobs.unpack_outputs(answer, blobs, jobs.time_slots(checked, sets, n_out), timed.verified)
        reasons = _integrity_reasons(jobs.check_integrity(
            answer, guards, layout, guard_seed, timed.input_sets, timed.sent_hashes), case.name)
        poison_counts = timed.poison_counts
        short = [i for i, count in enumerate(unwritten) if count != poison_counts[i % sets]]
        if short:
            reasons.append(Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case.name, detail=(
                f"{len(short)} of {len(samples)} timed launches left output elements unwritten "
                f"(first: launch {short[0]}, {unwritten[short[0]] - poison_counts[short[0] % sets]} elements)")))
        stale = self._stale_outputs(timed, outputs, answer["output_sha256"], checked)
        if stale:
            reasons.append(Reason(code=ReasonCode.TIMED_OUTPUT_MISMATCH, case=case.name, detail=(
                f"{len(stale)} re-checked timed outputs are wrong (first: {stale[0]}); "
                "a result must not depend on earlier launches")))
        return self._case_timing(case, answer, clock, samples, events, reasons,
                                 checked_launches=len(checked) + sets, unwritten_launches=len(short))

    def _case_timing(self, case: Case, answer: dict, clock: str, samples: list[float], events: list[float] | None,
                     reasons: list[Reason], **counts) -> CaseTiming:
        """A judged timing job: its samples' statistics (uneven launches refused), the worker's facts and
        `counts` (checked, audited, unwritten launches; which inputs)."""
        stats = summarize(samples)
        reasons = reasons + _uneven_launches(stats, case.name)
        kept_up = answer.get("host_kept_up")
        warnings = [] if kept_up is not False else [
            "the host could not queue the timed launches ahead of the GPU: samples may include idle gaps"]
        return CaseTiming(
            case=case.name, passed=not reasons, stats=stats, samples_ms=samples, launches=len(samples),
            clock=clock, event_samples_ms=events, event_median_ms=summarize(events).median_ms if events else None,
            kernel_floor_ms=answer.get("kernel_floor_ms"), gpu_busy_ms=answer.get("gpu_busy_ms"),
            event_overhead_ms=answer.get("event_overhead_ms"), reasons=reasons, host_kept_up=kept_up,
            warnings=warnings, **counts, **self._rates(case, stats))

    def _judge_fresh_timing(self, timed: _TimedCase, answer, blobs, audited, guard_seed,
                            expected: list[dict[str, np.ndarray]], header: dict,
                            audits: list[tuple[str, Future]]) -> CaseTiming:
        """A fresh-input timing: guard bands and fixed inputs as for any job; every launch's drawn inputs
        still hold their draw; every launch's outputs fully written (where no right output can hold the
        poison); each audited launch's outputs right for its own inputs; and each launch exactly the
        declared kernel, grid and block where the kernel clock recorded it."""
        case, layout = timed.case, timed.layout
        n_out, iterations = len(layout.outputs), self.settings.iterations
        clock, samples, events = _clocked_samples(answer, iterations)
        unwritten, changed = answer.get("unwritten", []), answer.get("changed_inputs")
        if len(unwritten) != iterations or not isinstance(changed, list) or len(changed) != iterations:
            raise jobs.AnswerError("timing answer has the wrong number of launch counts")
        outputs, guards = jobs.unpack_outputs(answer, blobs, jobs.audit_slots(audited, n_out), {})
        reasons = _integrity_reasons(jobs.check_integrity(
            answer, guards, layout, guard_seed, timed.input_sets, timed.sent_hashes), case.name)
        touched = [i for i, count in enumerate(changed) if count]
        if touched:
            reasons.append(Reason(code=ReasonCode.INPUT_MODIFIED, case=case.name, detail=(
                f"inputs changed by the kernel during {len(touched)} of {iterations} timed launches "
                f"(first: launch {touched[0]}, {changed[touched[0]]} elements)")))
        # An audited launch's right output may itself hold the poison's pattern: counted only where needed.
        allowed = {i: _poison_count(expected[k], layout, jobs.TIMING_POISON)
                   for k, i in enumerate(audited) if unwritten[i]}
        short = [i for i, count in enumerate(unwritten)
                 if count != allowed.get(i, 0) and (i in allowed or not timed.poison_is_a_value)]
        if short:
            reasons.append(Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case.name, detail=(
                f"{len(short)} of {iterations} timed launches left output elements unwritten "
                f"(first: launch {short[0]}, {unwritten[short[0]] - allowed.get(short[0], 0)} elements)")))
        audits.append((case.name, self._comparing().submit(self._audit_reasons, timed, outputs, audited, expected)))
        reasons += _undeclared_launches(answer.get("launch_records"), header, case.name)
        return self._case_timing(case, answer, clock, samples, events, reasons, checked_launches=len(audited),
                                 audited_launches=len(audited), inputs="fresh", unwritten_launches=len(short))

    def _comparing(self) -> ThreadPoolExecutor:
        if self._comparer is None:
            self._comparer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="audits")
        return self._comparer

    def _audit_reasons(self, timed: _TimedCase, outputs: list, audited: list[int],
                       expected: list[dict[str, np.ndarray]]) -> list[Reason]:
        wrong = self._wrong_audited(timed, outputs, audited, expected)
        if not wrong:
            return []
        return [Reason(code=ReasonCode.TIMED_OUTPUT_MISMATCH, case=timed.case.name, detail=(
            f"{len(wrong)} of {len(audited)} audited timed launches gave wrong outputs for their own fresh "
            f"inputs (first: {wrong[0]}); a result must be computed from the inputs of its launch"))]

    def _wrong_audited(self, timed: _TimedCase, outputs: list, audited: list[int],
                       expected: list[dict[str, np.ndarray]]) -> list[str]:
        layout, wrong = timed.layout, []
        n_out = len(layout.outputs)
        for k, i in enumerate(audited):
            for j, spec in enumerate(layout.outputs):
                got = jobs.read_arrays([outputs[k * n_out + j]], [spec])[spec.name]
                tol = self.task.tolerances[spec.name]
                check = compare_output(spec.name, expected[k][spec.name], got, tol.rtol, tol.atol)
                if not check.passed:
                    wrong.append(f"launch {i}: {_mismatch_detail(check)}")
        return wrong

    def _stale_outputs(self, timed: _TimedCase, outputs: list[bytes | None], hashes: list[str], checked) -> list[str]:
        """Re-checked and last outputs that are wrong. An output given as None is one whose bytes were
        already found right for its slot (jobs.unpack_outputs); each new one is compared, once; `hashes`
        are the outputs' sha256, checked by jobs.unpack_outputs against the bytes that came."""
        layout, expected_sets = timed.layout, timed.expected_sets
        n_out, sets = len(layout.outputs), len(expected_sets)
        labelled = [(f"launch {i} (input set {i % sets})", i % sets) for i in checked]
        labelled += [(f"last output of input set {s}", s) for s in range(sets)]
        stale, compared = [], {}
        for k, (label, set_index) in enumerate(labelled):
            for j, spec in enumerate(layout.outputs):
                blob, digest = outputs[k * n_out + j], hashes[k * n_out + j]
                if blob is None:
                    continue
                key = (set_index, j, digest)
                if key not in compared:
                    got = jobs.read_arrays([blob], [spec])[spec.name]
                    tol = self.task.tolerances[spec.name]
                    compared[key] = compare_output(spec.name, expected_sets[set_index][spec.name], got,
                                                   tol.rtol, tol.atol)
                    if compared[key].passed:
                        timed.verified[f"{set_index}/{j}"].add(digest)
                if not compared[key].passed:
                    stale.append(f"{label}: {_mismatch_detail(compared[key])}")
        return stale


@dataclass
class _TimedCase:
    """One case's timing state, shared by its batches."""

    case: Case
    layout: jobs.Layout
    input_sets: list[dict[str, np.ndarray]]
    sent_hashes: list[dict[str, str]]
    expected_sets: list[dict[str, np.ndarray]]
    poison_counts: list[int]
    # sha256 of the outputs found right, by slot ("SET/OUTPUT"): the Referee's sets, shared by every timing.
    verified: dict[str, set[str]] = field(default_factory=dict)
    # Fresh inputs: how each drawn input is drawn, by name (None: the rotated fixed sets)
    draws: dict[str, dict] | None = None
    poison_is_a_value: bool = False


class _Refused(Exception):
    """The job cannot be made for this case (its launch geometry does not hold there)."""

    def __init__(self, reason: Reason):
        super().__init__(reason.detail)
        self.reason = reason


@dataclass
class _RunResult:
    layout: jobs.Layout
    runs: list[dict[str, np.ndarray]] | None = None
    integrity: jobs.Integrity | None = None
    failure: Reason | None = None


_STOPS_A_CHECK = (ReasonCode.CUDA_FAULT, ReasonCode.TIMEOUT, ReasonCode.WORKER_CRASHED, ReasonCode.OUT_OF_MEMORY)


def run_ahead(produce: Callable) -> Iterator:
    """The items `produce(put, stopped)` puts, yielded as they come while it runs on in a thread, at
    most one item ahead. If the consumer stops early, the producer is told (`stopped()`), drained and
    joined before this returns: nothing it started is left running. Its exception is raised here."""
    items: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def run() -> None:
        try:
            produce(lambda item: _put_unless(items, stop, item), stop.is_set)
            items.put(_End(None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            items.put(_End(exc))

    thread = threading.Thread(target=run, name="check-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                items.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


@dataclass(frozen=True)
class _End:
    """The producer is done, or failed with `error`."""

    error: BaseException | None


def _put_unless(items: queue.Queue, stop: threading.Event, item) -> None:
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


# A launch's kernels run between its two events: their span can exceed the events' only by the two
# clocks' resolution. Beyond this, the kernel clock has lost track of the launches.
CLOCK_SLACK_MS, CLOCK_SLACK_REL = 0.002, 0.01


def _clocked_samples(answer: dict, iterations: int) -> tuple[str, list[float], list[float] | None]:
    """(clock, the samples on it, the event samples where the clock is "kernel")."""
    events = [float(x) for x in answer.get("samples_ms") or []]
    if len(events) != iterations:
        raise jobs.AnswerError("timing answer has the wrong number of samples")
    kernel = answer.get("kernel_samples_ms")
    if kernel is None:
        return "events", events, None
    kernel = [float(x) for x in kernel]
    if len(kernel) != iterations:
        raise jobs.AnswerError("timing answer has the wrong number of kernel-clock samples")
    late = [i for i, (k, e) in enumerate(zip(kernel, events)) if not 0 < k <= e * (1 + CLOCK_SLACK_REL) + CLOCK_SLACK_MS]
    if late:
        i = late[0]
        raise jobs.AnswerError(f"the kernel clock disagrees with the events on {len(late)} launches "
                               f"(first: launch {i}, {kernel[i]:.4f} ms against {events[i]:.4f} ms)")
    return "kernel", kernel, events


# An honest kernel's launches take about the same time: on an H200 the mean of a case's samples was within
# 1% of their median (its slowest launch within 13%). A kernel that does several launches' work in a few of
# them and little in the rest keeps the mean (the work is the same) and moves the median, which is the score.
UNEVEN_MEAN_OVER_MEDIAN = 1.5


def _uneven_launches(stats, case: str) -> list[Reason]:
    """A job whose mean launch is far above its median one: work shifted between launches, beyond any noise."""
    ratio = stats.mean_ms / stats.median_ms if stats.median_ms > 0 else 1.0
    if ratio <= UNEVEN_MEAN_OVER_MEDIAN:
        return []
    return [Reason(code=ReasonCode.UNEVEN_LAUNCHES, case=case, detail=(
        f"the mean timed launch ({stats.mean_ms * 1e3:.2f} us) is {ratio:.2f} times the median one "
        f"({stats.median_ms * 1e3:.2f} us), beyond the {UNEVEN_MEAN_OVER_MEDIAN:g} allowed: some launches do "
        "the work of others, which the median would not see"))]


def _undeclared_launches(records: list | None, header: dict, case: str) -> list[Reason]:
    """Timed launches whose kernel records (the kernel clock's: name, grid, block per kernel) are not the
    one declared kernel with its declared grid and block. None: no records (events alone, a library call)."""
    if records is None or "kernel" not in header:
        return []
    declared = [header["kernel"], list(header["launch"]["grid"]), list(header["launch"]["block"])]
    off = [(i, r) for i, r in enumerate(records) if r != [declared]]
    if not off:
        return []
    i, got = off[0]
    seen = "; ".join(f"{name} grid {tuple(grid)} block {tuple(block)}" for name, grid, block in got) or "no kernel"
    return [Reason(code=ReasonCode.LAUNCH_NOT_AS_DECLARED, case=case, detail=(
        f"{len(off)} timed launches did not run exactly the declared kernel {declared[0]} with grid "
        f"{tuple(declared[1])} and block {tuple(declared[2])} (first: launch {i} ran {seen})"))]


def _with_audits(timing: CaseTiming, audits: list[Future]) -> CaseTiming:
    """A case's timing with the outcome of its audits (their comparisons waited for here)."""
    found = [audit.result() for audit in audits]  # every comparison waited for, the first failure told
    reasons = next((r for r in found if r), [])
    if not reasons:
        return timing
    return timing.model_copy(update={"passed": False, "reasons": timing.reasons + reasons})


def _geometry(kernel: Kernel, case: Case):
    """The launch for this case, or the candidate's failure: its expressions may not hold on a case
    it was never checked against (a holdout shape)."""
    try:
        return kernel.launch.resolve(case), None
    except ValueError as exc:
        return None, Reason(code=ReasonCode.LAUNCH_ERROR, case=case.name,
                            detail=f"the launch geometry is invalid for this case: {exc}")


def _still_poisoned(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Elements holding each run's poison pattern: never written by the kernel.

    A correct element equals both patterns only by coincidence in both runs, which real outputs
    do not (the two poisons differ in every byte).
    """
    def holds(array: np.ndarray, byte: int) -> np.ndarray:
        return _equals_pattern(array, byte).reshape(array.shape)

    return holds(first, jobs.POISON_BYTES[0]) & holds(second, jobs.POISON_BYTES[1])


def _integrity_reasons(integrity: jobs.Integrity, case: str) -> list[Reason]:
    reasons = [Reason(code=ReasonCode.OUT_OF_BOUNDS_WRITE, case=case, detail=v) for v in integrity.guard_violations]
    if integrity.modified_inputs:
        reasons.append(Reason(code=ReasonCode.INPUT_MODIFIED, case=case,
                              detail=f"inputs changed by the kernel: {', '.join(integrity.modified_inputs)}"))
    return reasons


def _mismatch_detail(check) -> str:
    first = check.first_mismatches[0] if check.first_mismatches else None
    where = f"; first at {list(first.index)}: expected {first.expected:.6g}, got {first.got:.6g}" if first else ""
    nonfinite = f", {check.nonfinite_mismatches} NaN/Inf where they do not belong" if check.nonfinite_mismatches else ""
    return (f"{check.name}: {check.mismatches} of {check.elements} elements beyond tolerance "
            f"(max abs error {check.max_abs_error:.3g}, max rel error {check.max_rel_error:.3g}{nonfinite}){where}")


def _poison_count(expected: dict[str, np.ndarray], layout: jobs.Layout, byte: int) -> int:
    """Elements of a correct output that happen to equal the poison pattern (almost always 0)."""
    return sum(int(np.count_nonzero(_equals_pattern(expected[spec.name], byte))) for spec in layout.outputs)


def _equals_pattern(array: np.ndarray, byte: int) -> np.ndarray:
    """Flat: whether each element's bytes are all `byte` (compared as unsigned integers of its size)."""
    return raw_words(array) == int.from_bytes(bytes([byte]) * array.dtype.itemsize, "little")


def _guard_bytes(layout: jobs.Layout, sets: int) -> int:
    return 2 * jobs.GUARD_BYTES * len(layout.arrays) * sets


def _secret_subset(iterations: int, count: int) -> list[int]:
    """Launches to re-check, drawn from the OS's randomness so a kernel cannot predict them."""
    chooser = secrets.SystemRandom()
    return sorted(chooser.sample(range(iterations), min(count, iterations)))

