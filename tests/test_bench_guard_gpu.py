"""bench/guard_gpu.py on the CPU: without a GPU it says so and exits 2, writing nothing; its summary counts exit
statuses, verdicts per case and the step's cost after the first run from the guard's own results."""

from __future__ import annotations

from bench import guard_gpu
from guard.measure import StepCost
from guard.step import StepResult
from guard.verdict import CaseVerdict, Interval, Verdict
from tests.guard_fake_store import fake_fingerprint


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: "no NVIDIA driver library here")
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--quick"]) == 2
    assert "no GPU: no NVIDIA driver library here" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_an_interrupt_before_the_guard_runs_says_nothing_was_measured(tmp_path, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(guard_gpu, "played_run", interrupted)
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--quick"]) == 1
    assert "interrupted before the guard runs began: nothing measured" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_a_failed_approval_is_named_and_ends_the_bench(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(guard_gpu, "played_run", lambda root, *rest: root)
    monkeypatch.setattr(guard_gpu, "guard_cli", lambda argv: 1 if "softmax" in argv else 0)
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--no-sandbox"]) == 1
    assert "the approval of softmax failed (exit 1)" in capsys.readouterr().err


def result(verdict: Verdict, total_s: float, timing_s: float) -> StepResult:
    change = Interval(estimate=1.03, low=1.02, high=1.04, confidence=0.95)
    return StepResult(approval="a", node="n", fingerprint=fake_fingerprint("matmul_f32"),
                      verdicts=[CaseVerdict(approval="a", case=c, verdict=verdict, threshold=0.015, change=change,
                                            rounds=8) for c in ("x", "y")],
                      cost=StepCost(total_s=total_s, timing_s=timing_s, rounds=8))


def test_the_summary_counts_verdicts_and_the_cost_after_the_first_run():
    shown = guard_gpu.summary_of([result(Verdict.PASS, 30, 5), result(Verdict.PASS, 12, 8),
                                  result(Verdict.REGRESSED, 18, 10)])
    assert shown["exit_status"] == {0: 2, 1: 1}
    assert shown["verdicts"] == {"x": {"pass": 2, "regressed": 1}, "y": {"pass": 2, "regressed": 1}}
    assert shown["cost_ratio_after_first"] == {"median": 1.65, "max": 1.8}  # the first run's 6x is left out
    assert shown["change"][0] == {"x": 1.03, "y": 1.03}


def test_rounds_cut_by_an_interrupt_keep_every_step_measured_so_far():
    saved: list[dict] = []
    scenarios: dict = {}
    calls: list[str] = []

    def guard(name: str) -> StepResult:
        calls.append(name)
        if len(calls) == 6:  # the slot ends during the second round's second step
            raise KeyboardInterrupt
        return result(Verdict.PASS, 10, 5)

    complete = guard_gpu.guard_rounds({"unchanged": "a", "slower": "b", "wrong": "c"}, 20, guard, scenarios,
                                      lambda: saved.append({k: v["runs"] for k, v in scenarios.items()}))
    assert complete is False
    assert calls == ["a", "b", "c", "a", "b", "c"]
    assert {label: shown["runs"] for label, shown in scenarios.items()} == {"unchanged": 2, "slower": 2, "wrong": 1}
    assert len(saved) == 5 and saved[-1] == {"unchanged": 2, "slower": 2, "wrong": 1}


def test_rounds_that_all_run_are_complete():
    scenarios: dict = {}
    assert guard_gpu.guard_rounds({"unchanged": "a"}, 3, lambda name: result(Verdict.PASS, 10, 5), scenarios,
                                  lambda: None)
    assert scenarios["unchanged"]["runs"] == 3
