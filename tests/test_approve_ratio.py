"""The accepted ratio an approval holds the guard to: approve measures it in interleaved rounds with the guard
step's own timing (the fake executor standing in for the GPU), or takes the run's with --from-run, and says
which; the guard reads it; `guard --accept` records its run's rounds the same way; the bench draws approvals
both ways."""

from __future__ import annotations

import io

import numpy as np
import pytest

from bench.guard import approved_ratio, run_approval
from bench.guard_noise import RoundMaker, load_profiles
from guard import accepted
from guard.cli import main
from guard.run import GuardOptions, run_guard
from guard.step import guard_approval
from guard.store import READABLE, approval_dir, load_approval, load_store
from guard.verdict import TimingRound, Verdict, VerdictSettings
from harness.nvml import GpuState, GpuWatch
from server.replay import replay
from tests.approval_support import NAME, approved, fake, fresh_run, no_gpu, run_dir  # noqa: F401 - fixtures
from tests.fake_executor import FakeExecutor
from tests.guard_fake_store import add_approval, fake_fingerprint, new_store

QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)
CLEAR = GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980)
BUSY = GpuWatch(before=CLEAR, after=CLEAR, other_processes=[4242])


class SharedGpu(FakeExecutor):
    """A GPU on which another process (pid 4242) holds a context during every timing job."""

    def time(self, kernel, cases):
        report = super().time(kernel, cases)
        watch = BUSY.model_dump(mode="json")
        return report.model_copy(update={"cases": [c.model_copy(update={"gpu": watch}) for c in report.cases]})


def test_approve_measures_each_cases_accepted_ratio_in_32_interleaved_rounds(fresh_run, tmp_path):
    code, store, _, out = approved(tmp_path, fresh_run)
    assert code == 0, out
    approval = load_store(store)[0].approval
    measured = approval.ratio_measurement
    assert (measured.source, measured.rounds, measured.gpu) == ("guard-rounds", 32, "Fake GPU")
    assert measured.measured_at and "32 rounds of the guard's timing" in measured.why
    assert len(approval.cases) == 2
    for case in approval.cases:
        ratio = case.ratio
        assert ratio.rounds == 32 and ratio.set_aside == {} and ratio.confidence >= 0.95
        assert ratio.low < ratio.estimate < ratio.high and ratio.estimate == pytest.approx(0.5, rel=0.01)
        # what the guard holds its runs to: the rounds' ratio, not the run's
        assert accepted.accepted_fields(case) == {"accepted_ratio": ratio.estimate, "accepted_low": ratio.low,
                                                  "accepted_high": ratio.high, "accepted_confidence": ratio.confidence}
        run_only = accepted.accepted_fields(case.model_copy(update={"ratio": None}))
        assert run_only["accepted_ratio"] == case.kernel.median_ms / case.baseline.median_ms
        assert run_only["accepted_low"] == pytest.approx(1.0 / case.speedup.high)
    assert out.count("over 32 rounds") == 2 and "accepted ratio: round 1 of 32 beside the baseline" in out
    result = guard_approval(load_approval(store, NAME), lambda task, timing: FakeExecutor(task, gpu="Fake GPU"), QUICK)
    assert result.passed, [(v.case, v.verdict, v.message) for v in result.verdicts]


def test_a_baseline_taken_past_its_shape_is_counted_in_the_approval_and_said(fresh_run, tmp_path):
    two_paced = lambda task, timing: FakeExecutor(task, two_paced_baseline=True)  # noqa: E731
    code, store, _, out = approved(tmp_path, fresh_run, make_executor=two_paced)
    assert code == 0, out
    for case in load_store(store)[0].approval.cases:
        assert case.ratio.rounds == 32 and case.ratio.shape_waived == {"baseline": 32}
    assert out.count("(taken as measured though their launches' shape was refused: the baseline's in 32)") == 2
    code, store, _, out = approved(tmp_path / "even", fresh_run)  # an even baseline: nothing counted or said
    assert code == 0 and all(c.ratio.shape_waived == {} for c in load_store(store)[0].approval.cases)
    assert "taken as measured" not in out
    # nor written: an approval without waivers reads as one made before the field (the models forbid unknown ones)
    assert "shape_waived" not in (approval_dir(store, NAME) / READABLE).read_text()


def test_the_rounds_are_asked_for_by_number_and_never_fewer_than_8(fresh_run, tmp_path, capsys):
    code, store, key, _ = approved(tmp_path / "a", fresh_run, ratio_rounds=12)
    assert code == 0
    approval = load_store(store)[0].approval
    assert approval.ratio_measurement.rounds == 12 and {c.ratio.rounds for c in approval.cases} == {12}
    args = ["approve", str(fresh_run), "--store", str(store), "--name", "other", "--key", str(key)]
    with pytest.raises(SystemExit) as usage:
        main(args + ["--ratio-rounds", "4"])
    assert usage.value.code == 2 and "4 is out of range: from 8 to 1000" in capsys.readouterr().err


def test_without_a_gpu_approve_exits_3_naming_from_run(fresh_run, tmp_path, capsys):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0  # the replay needs no GPU now
    code, store, _, _ = approved(tmp_path, fresh_run, make_executor=None, gpu_absent=no_gpu)
    assert code == 3 and not approval_dir(store, NAME).exists()
    err = capsys.readouterr().err
    assert "the accepted ratio is measured on a GPU (32 interleaved rounds)" in err and "--from-run" in err


def test_a_gpu_another_process_uses_leaves_the_ratio_unmeasured_unless_from_run_or_forced(fresh_run, tmp_path,
                                                                                          capsys):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0
    shared = lambda task, timing: SharedGpu(task, gpu="Fake GPU")  # noqa: E731
    code, store, _, _ = approved(tmp_path / "a", fresh_run, make_executor=shared, ratio_rounds=8)
    assert code == 1 and not approval_dir(store, NAME).exists()
    err = capsys.readouterr().err
    assert "the accepted ratio could not be measured" in err and "--from-run" in err
    assert err.count("0 of 16 rounds usable (16 set aside for other_process)") == 2
    code, store, _, _ = approved(tmp_path / "b", fresh_run, make_executor=shared, ratio_rounds=8, force=True)
    assert code == 0
    approval = load_store(store)[0].approval
    assert approval.ratio_measurement.source == "run" and approval.provenance.forced
    assert approval.provenance.forced_over == [approval.ratio_measurement.why]
    assert approval.ratio_measurement.why.startswith("the accepted ratio was not measured in rounds")
    code, store, _, _ = approved(tmp_path / "c", fresh_run, make_executor=shared, from_run=True)
    assert code == 0 and not load_store(store)[0].approval.provenance.forced


def test_measure_replaces_set_aside_rounds_timing_only_the_cases_still_short():
    asked = []

    def round_(only):
        asked.append(only)
        troubled = len(asked) <= 4  # the first four rounds of case b had another process beside them
        return {c: TimingRound(candidate_ms=[1.0 + 0.01 * len(asked)], baseline_ms=[2.0],
                               watch=BUSY if troubled and c == "b" else None) for c in (only or ["a", "b"])}

    ratios = accepted.measure(round_, ["a", "b"], rounds=8)
    assert asked == [None] * 8 + [["b"]] * 4
    assert ratios["a"].rounds == ratios["b"].rounds == 8
    assert ratios["a"].set_aside == {} and ratios["b"].set_aside == {"other_process": 4}
    assert 0.5 < ratios["a"].low < ratios["a"].estimate < ratios["a"].high < 0.55
    with pytest.raises(ValueError, match="at least 8 rounds"):
        accepted.measure(round_, ["a"], rounds=4)


def test_accept_records_its_runs_rounds_as_the_new_accepted_ratio(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, fingerprint=fake_fingerprint("matmul_f32", nvrtc="12.9"))
    options = GuardOptions(store=store, make_executor=lambda a: lambda t, s: FakeExecutor(t), settings=QUICK,
                           accept=True, key=key)
    assert run_guard(options, io.StringIO()) == 0
    approval = load_store(store)[0].approval
    assert approval.ratio_measurement.source == "guard-rounds" and approval.ratio_measurement.gpu == "Fake GPU"
    for case in approval.cases:
        assert case.ratio.rounds == QUICK.min_rounds and case.ratio.estimate == pytest.approx(0.5, rel=0.01)
    result = guard_approval(load_approval(store, "matmul"), lambda t, s: FakeExecutor(t), QUICK)
    assert [v.verdict for v in result.verdicts] == [Verdict.PASS] * 2


def test_the_bench_makes_approvals_both_ways_through_the_guards_code():
    profile = next(p for p in load_profiles() if p.label == "transpose 4096x2048")
    settings = VerdictSettings()
    rounds = approved_ratio(RoundMaker(profile, 1.0, np.random.default_rng(3)), settings, 32)
    run = approved_ratio(RoundMaker(profile, 1.0, np.random.default_rng(3)), settings, 32, approval="run")
    for held in (rounds, run):
        assert held["accepted_low"] < held["accepted_ratio"] < held["accepted_high"]
        assert held["accepted_ratio"] == pytest.approx(0.5, rel=0.1)
    assert run == run_approval(RoundMaker(profile, 1.0, np.random.default_rng(3)), 2)
