"""What the guard step carries from the approval into the verdict and the page: the accepted ratio's own interval
(an approval timed fast by chance must not make a later run look slower) and each approval's trend picture in the
HTML page. The fake executor stands in for the GPU, as in tests/test_guard_run.py."""

from __future__ import annotations

import dataclasses
import io

import pytest

from guard.run import GuardOptions, run_guard
from guard.step import guard_approval
from guard.store import load_approval
from guard.verdict import Verdict, VerdictSettings
from harness.stats import speedup, summarize
from tests.fake_executor import FakeExecutor
from tests.guard_fake_store import add_approval, new_store

QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)


def fake(approval):
    return lambda task, timing: FakeExecutor(task)


def _with_wide_accepted_interval(loaded):
    """The approval as if its kernel had been timed with a spread of about +-10% around the same median (50 us)."""
    cases = []
    for case in loaded.approval.cases:
        kernel = summarize([0.050 * (0.9 + 0.2 * i / 48) for i in range(49)])
        cases.append(case.model_copy(update={"kernel": kernel, "speedup": speedup(case.baseline, kernel)}))
    return dataclasses.replace(loaded, approval=loaded.approval.model_copy(update={"cases": cases}))


def test_the_accepted_interval_reaches_the_verdict_from_the_speedup(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, now_us=51.5)  # 3% slower than accepted
    loaded = load_approval(store, "matmul")
    tight = guard_approval(loaded, fake(None), QUICK)
    assert [v.verdict for v in tight.verdicts] == [Verdict.REGRESSED] * 2
    wide = guard_approval(_with_wide_accepted_interval(loaded), fake(None), QUICK)
    # The accepted median's own interval (about +-3%) leaves a 3% change undecided, never called regressed
    assert [v.verdict for v in wide.verdicts] == [Verdict.INCONCLUSIVE] * 2
    for before, verdict in zip(tight.verdicts, wide.verdicts):
        assert 1.025 < verdict.change.estimate < 1.035
        assert verdict.change.low < 1.0 + verdict.threshold < before.change.low
        assert verdict.change.high - verdict.change.low > 0.05


def test_the_case_input_holds_the_accepted_ratio_interval_turned_from_the_speedup(tmp_path, monkeypatch):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    loaded = _with_wide_accepted_interval(load_approval(store, "matmul"))
    seen = []
    monkeypatch.setattr("guard.step.decide_with_repeats",
                        lambda case, correctness, next_round, settings: seen.append(case) or pytest.skip("seen"))
    with pytest.raises(pytest.skip.Exception):
        guard_approval(loaded, fake(None), QUICK)
    accepted = loaded.approval.cases[0]
    case = seen[0]
    assert case.accepted_low == pytest.approx(1.0 / accepted.speedup.high)
    assert case.accepted_high == pytest.approx(1.0 / accepted.speedup.low)
    assert case.accepted_low < case.accepted_ratio < case.accepted_high
    assert case.accepted_confidence == accepted.kernel.confidence == 0.95


def test_the_html_page_shows_a_trend_picture_per_approval(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    add_approval(store, key, "softmax", "softmax_f32", 40)
    page = tmp_path / "out" / "guard.html"
    for _ in range(2):  # the second run has a history to draw
        assert run_guard(GuardOptions(store=store, make_executor=fake, settings=QUICK, html=page), io.StringIO()) == 0
    text = page.read_text()
    assert text.count("<svg") == 2 and text.count('class="trend"') == 2
    for name in ("matmul", "softmax"):
        svg = (tmp_path / "out" / f"trend-{name}.svg").read_text()
        assert svg in text and text.index(f'id="approval-{name}"') < text.index(svg)


def test_a_speedup_interval_reaching_zero_gives_the_verdict_no_accepted_interval(tmp_path):
    """A speedup's low end of 0 (a baseline timed at nothing) has no ratio interval: the step goes on without one."""
    from guard.accepted import run_interval as _accepted_interval
    from harness.stats import Speedup

    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    accepted = load_approval(store, "matmul").approval.cases[0]
    at_zero = accepted.model_copy(update={"speedup": Speedup(ratio=1.0, low=0.0, high=2.0, beyond_noise=False)})
    assert _accepted_interval(at_zero) == {}
    sound = accepted.model_copy(update={"speedup": Speedup(ratio=1.0, low=0.5, high=2.0, beyond_noise=False)})
    assert _accepted_interval(sound)["accepted_high"] == pytest.approx(2.0)
