"""bench/guard_gpu.py on the CPU: without a GPU it says so and exits 2, writing nothing; its summary counts exit
statuses, verdicts per case and the step's cost after the first run from the guard's own results."""

from __future__ import annotations

import json

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


def result(verdict: Verdict, total_s: float, timing_s: float, board: str = "GPU-1") -> StepResult:
    change = Interval(estimate=1.03, low=1.02, high=1.04, confidence=0.95)
    return StepResult(approval="a", node="n", fingerprint=fake_fingerprint("matmul_f32", gpu_uuid=board),
                      verdicts=[CaseVerdict(approval="a", case=c, verdict=verdict, threshold=0.015, change=change,
                                            rounds=8) for c in ("x", "y")],
                      cost=StepCost(total_s=total_s, timing_s=timing_s, rounds=8))


def test_the_summary_counts_verdicts_and_the_cost_after_the_first_run():
    shown = guard_gpu.summary_of([result(Verdict.PASS, 30, 5), result(Verdict.PASS, 12, 8),
                                  result(Verdict.REGRESSED, 18, 10, board="GPU-2")])
    assert shown["exit_status"] == {0: 2, 1: 1}
    assert shown["verdicts"] == {"x": {"pass": 2, "regressed": 1}, "y": {"pass": 2, "regressed": 1}}
    assert shown["cost_ratio_after_first"] == {"median": 1.65, "max": 1.8}  # the first run's 6x is left out
    assert shown["change"][0] == {"x": 1.03, "y": 1.03}
    assert shown["boards"] == {"GPU-1": 2, "GPU-2": 1}
    assert shown["shape_waived"] == {}


def test_the_summary_counts_the_yardstick_timings_taken_past_their_shape(capsys):
    waived = result(Verdict.PASS, 12, 8).model_copy(update={"shape_waived": {
        "baseline": {"x": ["timing_modes: two groups"] * 3, "y": ["timing_spread: wide"]}}})
    shown = guard_gpu.summary_of([result(Verdict.PASS, 30, 5), waived, waived])
    assert shown["shape_waived"] == {"baseline": 8}  # 4 case-rounds in each of two steps
    guard_gpu.print_summary({"gpu": "G", "runs": 3, "complete": True, "seconds": 1.0, "scenarios": {"s": shown}})
    assert "the baseline's shape taken past in 8 case-round(s)" in capsys.readouterr().out


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


def test_rounds_go_on_from_the_steps_a_cut_run_measured():
    calls: list[str] = []
    recorded: list[str] = []
    earlier = {"a": [result(Verdict.PASS, 10, 5)] * 2, "b": [result(Verdict.PASS, 10, 5)]}  # cut in round 2

    def guard(name: str) -> StepResult:
        calls.append(name)
        return result(Verdict.PASS, 10, 5)

    scenarios: dict = {}
    assert guard_gpu.guard_rounds({"a": "A", "b": "B"}, 3, guard, scenarios, lambda: None, earlier,
                                  lambda label, step: recorded.append(label))
    assert calls == ["B", "A", "B"] and recorded == ["b", "a", "b"]  # round 2's missing step, then round 3
    assert scenarios["a"]["runs"] == 3 and scenarios["b"]["runs"] == 3
    assert len(earlier["a"]) == 2  # the caller's lists are left as they were


def test_a_run_with_a_work_folder_goes_on_from_its_steps(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    names = {"unchanged": "a", "wrong": "a-wrong"}
    (work / "state.json").write_text(json.dumps({"names": names, "calibration": {}, "gpu": "H100",
                                                 "code": guard_gpu.code_digest(), "runs": 2}))
    guard_gpu._append(work / "steps.jsonl", "unchanged", result(Verdict.PASS, 10, 5))

    def never(*args):
        raise AssertionError("the approvals were made again")

    steps: list[str] = []

    def step(store, name, confine, settings):
        steps.append(name)
        return result(Verdict.INCORRECT if "wrong" in name else Verdict.PASS, 10, 5)

    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(guard_gpu, "this_gpu", lambda: "H100")
    monkeypatch.setattr(guard_gpu, "played_run", never)
    monkeypatch.setattr(guard_gpu, "step", step)
    out = tmp_path / "out.json"
    assert guard_gpu.main(["--out", str(out), "--runs", "2", "--work", str(work)]) == 0
    assert steps == ["a-wrong", "a", "a-wrong"]
    document = json.loads(out.read_text())
    assert document["complete"] and document["scenarios"]["unchanged"]["runs"] == 2
    assert document["scenarios"]["unchanged"]["boards"] == {"GPU-1": 2}
    assert document["scenarios"]["wrong"]["verdicts"] == {"x": {"incorrect": 2}, "y": {"incorrect": 2}}
    measured = guard_gpu.measured_steps(work / "steps.jsonl", names)
    assert [len(measured[label]) for label in names] == [2, 2]
    assert measured["wrong"][0] == result(Verdict.INCORRECT, 10, 5)
    assert f"going on from {work}" in capsys.readouterr().err


def test_a_work_folder_of_other_code_other_runs_or_another_model_is_not_gone_on_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: None)
    state = {"names": {"a": "a"}, "calibration": {}, "gpu": "H100", "code": "0" * 64, "runs": 20}
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--work", str(tmp_path)]) == 1
    assert "holds the runs of other code" in capsys.readouterr().err
    (tmp_path / "state.json").write_text(json.dumps(state | {"code": guard_gpu.code_digest()}))
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--work", str(tmp_path), "--quick"]) == 1
    assert "was begun for 20 runs, not 2: remove it to start afresh" in capsys.readouterr().err
    monkeypatch.setattr(guard_gpu, "this_gpu", lambda: "NVIDIA H200")  # carried to another model's machine
    assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--work", str(tmp_path)]) == 1
    assert "was begun on a H100, not this NVIDIA H200: remove it to start afresh" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_a_work_folder_cut_before_its_runs_began_is_prepared_afresh(tmp_path, monkeypatch, capsys):
    reached: list[Path] = []

    def interrupted(root, *args):
        reached.append(root)
        raise KeyboardInterrupt

    monkeypatch.setattr(guard_gpu, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(guard_gpu, "played_run", interrupted)
    for _ in range(2):  # the second finds the first's key and store, and makes them again
        assert guard_gpu.main(["--out", str(tmp_path / "out.json"), "--work", str(tmp_path), "--quick"]) == 1
        assert "nothing measured" in capsys.readouterr().err
    assert len(reached) == 2 and (tmp_path / "made" / "keys").is_dir() and not (tmp_path / "state.json").exists()


def test_a_step_cut_in_its_writing_is_dropped_and_measured_again(tmp_path):
    steps = tmp_path / "steps.jsonl"
    guard_gpu._append(steps, "a", result(Verdict.PASS, 10, 5))
    guard_gpu._append(steps, "b", result(Verdict.PASS, 10, 5))
    steps.write_text(steps.read_text()[:-40])  # the second line cut short
    measured = guard_gpu.measured_steps(steps, {"a": "A", "b": "B"})
    assert [len(measured["a"]), len(measured["b"])] == [1, 0]
    guard_gpu._append(steps, "b", result(Verdict.PASS, 10, 5))
    assert [len(v) for v in guard_gpu.measured_steps(steps, {"a": "A", "b": "B"}).values()] == [1, 1]
