"""The launches' shape judges the kernel being judged only: a yardstick (the task's own kernel, a best judged
before, the vendor library, an approval's baseline) whose timing is refused for its shape alone is taken as
measured, and any other refusal stands."""

import io

import anyio
import pytest

from harness.results import CaseTiming, CheckReport, Reason, ReasonCode, TimingReport
from harness.side_by_side import TimingFailed, time_side_by_side
from harness.stats import summarize
from harness.task import load_task
from harness.vendor_yardstick import time_vendor
from harness.worker_side.nvrtc import compile_kernel
from server.check import _check_and_time, targets_for
from harness.timing_shape import WAIVED, shape_of, shape_reasons, shape_waived, shape_waivers
from server.records import Verdict
from server.run import RunSettings
from tests.server_support import MATMUL, client, kernel, new_run, ok, read_json


def _two_paced(case: str, median_ms: float = 2.32) -> CaseTiming:
    """A quarter of the launches 16% slower, refused for its shape as the protocol refuses it."""
    samples = [median_ms * (1 + 0.001 * (i % 7)) for i in range(30)] + [median_ms * 1.16] * 10
    reasons = shape_reasons(shape_of(samples), case)
    assert [r.code for r in reasons] == [ReasonCode.TIMING_MODES]
    return CaseTiming(case=case, passed=False, stats=summarize(samples), samples_ms=samples, reasons=reasons)


def _even(case: str, median_ms: float) -> CaseTiming:
    samples = [median_ms * (1 + 0.001 * (i % 5)) for i in range(40)]
    return CaseTiming(case=case, passed=True, stats=summarize(samples), samples_ms=samples)


def test_a_timing_refused_for_its_shape_alone_passes_with_the_reason_kept_as_a_warning():
    report = TimingReport(passed=False, cases=[_even("a", 0.5), _two_paced("b")])
    waived = shape_waived(report)
    assert waived.passed and all(c.passed and not c.reasons for c in waived.cases)
    warning, = waived.cases[1].warnings
    assert warning.startswith(WAIVED) and "two groups" in warning
    assert waived.cases[1].samples_ms == report.cases[1].samples_ms  # as measured
    assert waived.score_ms == pytest.approx((0.5 * waived.cases[1].stats.median_ms) ** 0.5, rel=1e-3)
    assert not report.passed and report.cases[1].reasons  # the report given is left as it was


@pytest.mark.parametrize("other", [ReasonCode.UNWRITTEN_OUTPUT, ReasonCode.TIMED_OUTPUT_MISMATCH,
                                   ReasonCode.UNEVEN_LAUNCHES, ReasonCode.TIMEOUT])
def test_any_other_reason_stands_beside_a_shape_refusal(other):
    shaped = _two_paced("b")
    wrong = shaped.model_copy(update={"reasons": shaped.reasons + [Reason(code=other, case="b", detail="x")]})
    for cases in ([_even("a", 0.5), wrong], [wrong.model_copy(update={"reasons": [Reason(code=other, detail="x")]})],
                  [shaped, CaseTiming(case="c", passed=False, reasons=[Reason(code=other, case="c", detail="x")])]):
        report = TimingReport(passed=False, cases=cases)
        assert shape_waived(report) is report


def test_shape_waivers_names_per_refused_case_what_the_waiver_takes_past_and_nothing_else():
    report = TimingReport(passed=False, cases=[_even("a", 0.5), _two_paced("b")])
    waivers = shape_waivers(report)
    assert list(waivers) == ["b"] and len(waivers["b"]) == 1 and waivers["b"][0].startswith("timing_modes: ")
    shaped = _two_paced("b")
    mixed = shaped.model_copy(update={
        "reasons": shaped.reasons + [Reason(code=ReasonCode.TIMEOUT, case="b", detail="x")]})
    assert shape_waivers(TimingReport(passed=False, cases=[mixed])) == {}
    assert shape_waivers(TimingReport(passed=True, cases=[_even("a", 0.5)], score_ms=0.5)) == {}
    assert shape_waivers(TimingReport(passed=False, cases=[])) == {}


def test_a_refusal_without_samples_or_reasons_stands_and_a_passed_timing_is_returned_as_it_is():
    bare = TimingReport(passed=False, cases=[CaseTiming(case="a", passed=False)])
    assert shape_waived(bare) is bare
    shaped = _two_paced("b")
    no_stats = TimingReport(passed=False, cases=[shaped.model_copy(update={"stats": None})])
    assert shape_waived(no_stats) is no_stats
    passed = TimingReport(passed=True, cases=[_even("a", 0.5)], score_ms=0.5)
    assert shape_waived(passed) is passed
    inconsistent = TimingReport(passed=False, cases=[_even("a", 0.5)])  # refused, yet no case refused: not waived
    assert shape_waived(inconsistent) is inconsistent


def _timer(two_paced: set[str]):
    def time(kernel, cases):
        made = [_two_paced(c.name) if kernel in two_paced else _even(c.name, 0.1 if kernel == "k" else 2.3)
                for c in cases]
        return TimingReport(passed=all(c.passed for c in made), cases=made)
    return time


CASES = [type("C", (), {"name": "square-4096"})()]


def test_side_by_side_judges_the_candidates_shape_and_takes_the_yardsticks_as_measured():
    timed = time_side_by_side(_timer({"b", "best"}), {"baseline": "b", "best": "best", "candidate": "k"}, CASES, 2)
    assert len(timed.samples["baseline"]["square-4096"]) == 80 and len(timed.samples["best"]["square-4096"]) == 80
    assert timed.cases["baseline"]["square-4096"].warnings[0].startswith(WAIVED)
    assert {label: len(per["square-4096"]) for label, per in timed.waived.items()} == {"baseline": 2, "best": 2}
    assert all(r.startswith("timing_modes: ") and "two groups" in r for r in timed.waived["baseline"]["square-4096"])
    with pytest.raises(TimingFailed) as failed:
        time_side_by_side(_timer({"k"}), {"baseline": "b", "candidate": "k"}, CASES, 2)
    assert failed.value.label == "candidate" and failed.value.reasons[0].code is ReasonCode.TIMING_MODES
    alone = time_side_by_side(_timer({"k"}), {"candidate": "k"}, CASES, 1, judged=())  # the task's own kernel
    assert alone.cases["candidate"]["square-4096"].passed


def test_a_run_whose_baseline_runs_at_two_paces_starts_and_judges_its_attempts(tmp_path):
    """The task's own kernel two-paced on every timing: the run records it, a probe and an attempt are timed
    beside it, and a candidate two-paced itself is still rejected for its shape."""
    run = new_run(tmp_path, executor_options={"two_paced_baseline": True})
    answers = {}

    async def drive() -> None:
        async with client(run) as c:
            answers["probe"] = await ok(c, "time_kernel", source=kernel("latency_us=40"))
            answers["fast"] = await ok(c, "record_attempt", source=kernel("latency_us=40"), rationale="fast")
            answers["paced"] = await ok(c, "record_attempt", source=kernel("latency_us=30", "two-paced"),
                                        rationale="two paces")

    try:
        anyio.run(drive, backend="asyncio")
    finally:
        run.close()
    history = read_json(run.dir / "history.json")
    baseline = history[0] if isinstance(history, list) else history["attempts"][0]
    assert baseline["verdict"] == Verdict.BASELINE.value
    attempts = history if isinstance(history, list) else history["attempts"]
    for row in baseline["timing"].values():  # recorded as measured, and said so
        assert list(row["shape_waived"]) == ["candidate"]
        assert row["shape_waived"]["candidate"][0].startswith("timing_modes: ")  # its code, then what was seen
    for row in attempts[1]["timing"].values():
        assert set(row["shape_waived"]) == {"baseline"} and len(row["shape_waived"]["baseline"]) == RunSettings().timing_rounds
    assert answers["probe"]["speedup_vs_baseline"]["ratio"] > 2, answers["probe"]
    fast, paced = answers["fast"], answers["paced"]
    assert fast["verdict"] == Verdict.VALID_FASTER.value, fast
    assert paced["verdict"] == Verdict.REJECTED.value, paced
    assert "timing_modes" in str(paced), paced


def test_the_vendor_library_is_a_yardstick_its_shape_not_held_against_it():
    task = load_task(MATMUL)
    cases = list(task.performance_cases)

    class Referee:
        def __init__(self, timing):
            self.task, self.timing = task, timing

        def time_vendor(self, cases, call_for):
            return TimingReport(passed=False, cases=[self.timing(c.name) for c in cases])

    report = time_vendor(Referee(_two_paced), cases)
    assert report.timing.passed and not report.notes and set(report.medians_ms) == {c.name for c in cases}
    unwritten = lambda name: _two_paced(name).model_copy(update={"reasons": [  # noqa: E731
        Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=name, detail="3 launches left elements unwritten")]})
    report = time_vendor(Referee(unwritten), cases)
    assert not report.timing.passed and "failed the protocol" in report.notes[0] and report.medians_ms == {}


def test_check_takes_the_tasks_own_kernels_as_measured_and_judges_a_kernel_it_is_given(tmp_path):
    task = load_task(MATMUL)

    class Executor:
        referee = type("Referee", (), {"device_off": None})()

        def check(self, kernel, cases):
            return CheckReport(passed=True, cases=[])

        def time(self, kernel, cases):
            return TimingReport(passed=False, cases=[_two_paced(c.name) for c in cases])

    given = tmp_path / "mine.cu"
    given.write_text(task.source("initial"))
    targets = targets_for(task, None, None) + targets_for(task, given, None)
    for target in targets:
        target.compiled = compile_kernel(target.source, task.kernel_name, arch="sm_90")
        _check_and_time(task, Executor(), target, io.StringIO())
    assert [t.passed for t in targets] == [True, True, False]
    assert targets[-1].timing.cases[0].reasons[0].code is ReasonCode.TIMING_MODES
