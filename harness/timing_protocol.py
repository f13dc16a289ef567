"""The timing protocol: batches of timed launches until the median is known, each batch judged on
its own (guard bands, inputs, stale or wrong outputs, audits, declared launches), then merged.

`TimingProtocol` is the timing half of harness/referee.py's Referee, which holds the inputs, the
expected outputs and the workers it uses.
"""

from __future__ import annotations

import secrets
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from harness import jobs
from harness.audit_bound import secret_audits
from harness.compare import compare_output
from harness.gpu_lease import held
from harness.judging import (audit_reasons, integrity_reasons, mismatch_detail, poison_count, tampered_reasons,
                             undeclared_launches, uneven_launches)
from harness.nvml import GpuWatch, judge
from harness.peaks import roofline_fraction, roofline_ms
from harness.results import CaseTiming, Reason, ReasonCode, TimingReport
from harness.settings import ReferenceFailed, input_seed
from harness.stats import StoppingRule, geometric_mean, median_rel_halfwidth, summarize
from harness.task_model import INTEGER_DTYPES, Case
from harness.timing_shape import shape_of, shape_reasons
from harness.worker_calls import (STOPS_A_SEQUENCE, Refused, call_worker, clocked_samples, guard_bytes_of,
                                  launch_geometry)
from harness.worker_side import buffers, fresh_inputs
from sandbox.pool import Worker


class TimingProtocol:
    def _time_cases(self, cases: list[Case], make_job, worker: Worker) -> TimingReport:
        """Each case in turn, holding the GPU's lease (harness/gpu_lease.py). The audited outputs of fresh-input
        timings are compared on other threads while the next jobs run on the GPU; every comparison is done
        before this returns."""
        audits: list[tuple[str, Future]] = []  # (case, its comparison under way)
        timings: list[CaseTiming] = []
        with held(self.lease, self._deadline()):
            for case in cases:  # no further case after one that stopped or lost the worker (too_slow, timeout...)
                timings.append(self._time_case(case, make_job, worker, audits))
                if any(r.code in STOPS_A_SEQUENCE for r in timings[-1].reasons):
                    break
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
        refused: list[Reason] = []
        if shape_reasons(shape_of(rule.samples), case.name):
            # Modes, or a spread wider than honest kernels': one more job decides, judged alone (a GPU whose pace
            again = self._time_batch(timed, make_job, worker, audits)  # changed between jobs is no kernel that does)
            refused = again.reasons or shape_reasons(shape_of(again.samples_ms), case.name)
            batches = batches if refused else [again.model_copy(update={"warnings": [*again.warnings, _AGAIN]})]
        watch = judge(before, self.nvml.read(), self._our_pids()) if self.nvml and before else None
        if refused:  # with NVML's readings: a yardstick taken as measured (shape_waived) is still seen disturbed
            update = {"passed": False, "reasons": refused, "batches": len(batches) + 1}
            return again.model_copy(update=update | {"gpu": watch.model_dump(mode="json") if watch else None})
        return self._merged(case, batches, watch)

    def _timed_case(self, case: Case) -> _TimedCase:
        """What every batch of a case's timing shares. The input sets (and their hashes) are fixed per
        case and seed: made once, they stay out of every later timing's wall time."""
        layout = jobs.Layout.for_case(self.task, case.dims)
        if self.settings.fresh_inputs or self.draws(case) is not None:  # a large case has no input sets to send
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
        fixed, fixed_hashes = {}, {}
        if len(draws) < len(self.task.input_params):  # the host makes the inputs only where some are not drawn
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
        geometry, failure = launch_geometry(self.reference, case)
        if failure is not None:
            raise ReferenceFailed(case.name, f"{failure.code.value}: {failure.detail}")
        guard_seed = secrets.randbits(62)

        def build(resident: frozenset[str]):
            return jobs.make_draw_run_job(self.reference.cubin, self.reference.symbol, layout, geometry,
                                     timed.input_sets[0], fresh, launches, guard_seed, timed.sent_hashes[0], resident)

        out_bytes = sum(a.nbytes for a in layout.outputs) * len(launches)
        # One reference launch per audited launch in this one job: each gets a check job's allowance.
        deadline_s = self.run_deadline_s(case) * max(1, len(launches))
        answer, blobs, failure = call_worker(self.pool.reference, build, deadline_s,
                                            out_bytes + guard_bytes_of(layout, 1), case.name, self._deadline())
        if failure is not None:
            raise ReferenceFailed(case.name, f"{failure.code.value} on the inputs of audited launches: {failure.detail}")
        n = len(layout.outputs)
        outputs, _ = jobs.unpack_outputs(answer, blobs, buffers.audit_slots(launches, n), {})
        return [jobs.read_arrays(outputs[k * n:(k + 1) * n], layout.outputs) for k in range(len(launches))]

    def _poison_count(self, case: Case, seed: int, layout: jobs.Layout) -> int:
        key = (case.name, seed)
        if key not in self._poison_counts:
            kept = self.kept_facts(case, seed)  # counted where the expected outputs are kept, if on the device
            self._poison_counts[key] = (sum(kept.poison_count.values()) if kept is not None else
                                        poison_count(self.expected(case, seed), layout, buffers.TIMING_POISON))
        return self._poison_counts[key]

    def _our_pids(self) -> list[int]:
        return [w.pid for w in (self.pool.candidate, self.pool.reference) if w.alive]

    def _time_batch(self, timed: _TimedCase, make_job, worker: Worker,
                    audits: list[tuple[str, Future]]) -> CaseTiming:
        """`make_job(case, layout, input_sets, timing)` gives (header, blobs), or raises Refused."""
        s, case, layout = self.settings, timed.case, timed.layout
        checked = secret_audits(s.iterations, s.audits_per_job(sum(a.nbytes for a in layout.outputs)))
        guard_seed = secrets.randbits(62)
        timing = {"warmups": s.warmups, "iterations": s.iterations, "cold_l2": s.cold_l2,
                  "checked_launches": checked, "guard_seed": guard_seed, "clock": s.clock, "hashes": timed.sent_hashes,
                  "known_outputs": {slot: sorted(hashes) for slot, hashes in timed.verified.items() if hashes}}
        limit = self._launch_limit(worker, case)
        if limit is not None:
            timing["launch_limit_s"] = limit
        sets = len(timed.input_sets)
        on_device = timed.draws is not None and worker is self.pool.candidate and self.judges_audits_on_device(case)
        # The answer's bound: on the device, a worker that cannot export the outputs reads them back after all.
        out_bytes = sum(a.nbytes for a in layout.outputs) * (len(checked) + sets)
        expected = None
        if timed.draws is not None:
            fresh = jobs.FreshDraws(key=secrets.randbits(64), draws=timed.draws)
            timing.update(fresh=fresh, known_outputs={}, hashes=timed.sent_hashes)
            launches = [s.warmups + i for i in checked]
            expected = (self.device_draws(timed, fresh, launches) if on_device
                        else self._reference_draws(timed, fresh, launches))
        built: list[dict] = []

        def build(resident: frozenset[str]):
            header, blobs = make_job(case, layout, timed.input_sets, {**timing, "resident": resident})
            if on_device:
                header["hold_outputs"] = True  # the audited launches' outputs stay on the device, judged there
            built[:] = [header]
            return header, blobs

        try:
            answer, blobs_back, failure = call_worker(worker, build, self.time_deadline_s(case),
                                                     out_bytes + guard_bytes_of(layout, sets), case.name,
                                                     self._deadline())
        except Refused as refused:
            failure = refused.reason
        if failure is not None:
            return CaseTiming(case=case.name, passed=False, reasons=[self._explained(failure)])
        if on_device:
            wrong = self.judge_audits(timed, answer, checked, expected)
            if wrong is None:  # not judged on the device after all (device_off says why): the batch again, on the host
                return self._time_batch(timed, make_job, worker, audits)
            return self._judge_fresh_timing(timed, answer, blobs_back, checked, guard_seed, expected, built[0], audits,
                                            wrong)
        if expected is not None:
            return self._judge_fresh_timing(timed, answer, blobs_back, checked, guard_seed, expected, built[0], audits)
        return self._judge_timing(timed, answer, blobs_back, checked, guard_seed)

    def _merged(self, case: Case, batches: list[CaseTiming], watch: GpuWatch | None) -> CaseTiming:
        if len({b.clock for b in batches}) > 1:
            raise jobs.AnswerError(f"case {case.name}: the worker's timings changed clock between batches")
        samples = [x for b in batches for x in b.samples_ms]
        events = [x for b in batches for x in b.event_samples_ms] if batches[0].clock == "kernel" else None
        stats = summarize(samples)
        warnings = list(dict.fromkeys(w for b in batches for w in b.warnings))
        if watch is not None:
            warnings += watch.warnings
        noise = median_rel_halfwidth(samples)
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
            "audit_jobs": [job for b in batches for job in b.audit_jobs],
            "unwritten_launches": sum(b.unwritten_launches for b in batches),
            "host_kept_up": all(kept_up) if kept_up else None,
            "warnings": warnings, "batches": len(batches), "median_rel_halfwidth": noise,
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
        clock, samples, events = clocked_samples(answer, self.settings.iterations)
        unwritten = answer.get("unwritten", [])
        if len(unwritten) != self.settings.iterations:
            raise jobs.AnswerError("timing answer has the wrong number of samples")
        outputs, guards = jobs.unpack_outputs(answer, blobs, buffers.time_slots(checked, sets, n_out), timed.verified)
        reasons = tampered_reasons(answer, case.name) + integrity_reasons(jobs.check_integrity(
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
        reasons = reasons + uneven_launches(stats, case.name)
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
                            expected: list, header: dict, audits: list[tuple[str, Future]],
                            wrong: list[str] | None = None) -> CaseTiming:
        """A fresh-input timing: guard bands and fixed inputs as for any job; every launch's drawn inputs
        still hold their draw; every launch's outputs fully written (where no right output can hold the
        poison); each audited launch's outputs right for its own inputs; and each launch exactly the
        declared kernel, grid and block where the kernel clock recorded it. `wrong`: the audited launches
        already judged on the device (harness/device_checks.py), whose `expected` are the kept outputs' facts."""
        case, layout = timed.case, timed.layout
        n_out, iterations = len(layout.outputs), self.settings.iterations
        clock, samples, events = clocked_samples(answer, iterations)
        unwritten, changed = answer.get("unwritten", []), answer.get("changed_inputs")
        if len(unwritten) != iterations or not isinstance(changed, list) or len(changed) != iterations:
            raise jobs.AnswerError("timing answer has the wrong number of launch counts")
        slots = [] if wrong is not None else buffers.audit_slots(audited, n_out)
        outputs, guards = jobs.unpack_outputs(answer, blobs, slots, {})
        reasons = tampered_reasons(answer, case.name) + integrity_reasons(jobs.check_integrity(
            answer, guards, layout, guard_seed, timed.input_sets, timed.sent_hashes), case.name)
        touched = [i for i, count in enumerate(changed) if count]
        if touched:
            reasons.append(Reason(code=ReasonCode.INPUT_MODIFIED, case=case.name, detail=(
                f"inputs changed by the kernel during {len(touched)} of {iterations} timed launches "
                f"(first: launch {touched[0]}, {changed[touched[0]]} elements)")))
        # An audited launch's right output may itself hold the poison's pattern: counted only where needed.
        allowed = {i: (sum(expected[k].poison_count.values()) if wrong is not None
                       else poison_count(expected[k], layout, buffers.TIMING_POISON))
                   for k, i in enumerate(audited) if unwritten[i]}
        short = [i for i, count in enumerate(unwritten)
                 if count != allowed.get(i, 0) and (i in allowed or not timed.poison_is_a_value)]
        if short:
            reasons.append(Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case.name, detail=(
                f"{len(short)} of {iterations} timed launches left output elements unwritten "
                f"(first: launch {short[0]}, {unwritten[short[0]] - allowed.get(short[0], 0)} elements)")))
        if wrong is not None:
            reasons += audit_reasons(case.name, wrong, len(audited))
        else:
            audits.append((case.name, self._comparing().submit(self._audit_reasons, timed, outputs, audited, expected)))
        reasons += undeclared_launches(answer.get("launch_records"), header, case.name)
        return self._case_timing(case, answer, clock, samples, events, reasons, checked_launches=len(audited),
                                 audited_launches=len(audited), inputs="fresh", unwritten_launches=len(short),
                                 audit_jobs=[[iterations, len(audited)]])

    def _comparing(self) -> ThreadPoolExecutor:
        if self._comparer is None:
            self._comparer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="audits")
        return self._comparer

    def _audit_reasons(self, timed: _TimedCase, outputs: list, audited: list[int],
                       expected: list[dict[str, np.ndarray]]) -> list[Reason]:
        return audit_reasons(timed.case.name, self._wrong_audited(timed, outputs, audited, expected), len(audited))

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
                    wrong.append(f"launch {i}: {mismatch_detail(check)}")
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
                    stale.append(f"{label}: {mismatch_detail(compared[key])}")
        return stale


_AGAIN = ("measured again in one more job: the first jobs' launches fell into distinct modes or spread "
          "wide (harness/timing_shape.py), this job's did not")


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


def _with_audits(timing: CaseTiming, audits: list[Future]) -> CaseTiming:
    """A case's timing with the outcome of its audits (their comparisons waited for here)."""
    found = [audit.result() for audit in audits]  # every comparison waited for, the first failure told
    reasons = next((r for r in found if r), [])
    if not reasons:
        return timing
    return timing.model_copy(update={"passed": False, "reasons": timing.reasons + reasons})

