"""bench/spreads.py on the CPU: a task's reference is timed under the candidates' launch only where it is right
under that launch (a run can then have it as its baseline); elsewhere it is left out, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import spreads
from harness.results import CaseCheck, CheckReport, Reason, ReasonCode
from harness.task import load_task
from tests.fake_executor import FakeExecutor

CASES = Path(__file__).resolve().parents[1] / "cases"


class ReferenceWrongUnderTheCandidatesLaunch(FakeExecutor):
    def check(self, kernel, cases, seeds=None, against_oracle=False):
        if kernel.label == "reference" and kernel.launch == self.task.launch:
            return CheckReport(passed=False, cases=[CaseCheck(case=cases[0].name, role=cases[0].role, passed=False,
                                                              reasons=[Reason(code=ReasonCode.UNWRITTEN_OUTPUT,
                                                                              case=cases[0].name, detail="y")])])
        return super().check(kernel, cases, seeds, against_oracle)


@pytest.mark.parametrize("executor_class,kept", [(FakeExecutor, True), (ReferenceWrongUnderTheCandidatesLaunch, False)])
def test_the_reference_as_a_candidate_only_where_it_is_right_under_that_launch(executor_class, kept, capsys):
    task = load_task(CASES / "softmax_f32")
    assert task.own_launch("reference") != task.launch
    found = dict(spreads.kernels_of(executor_class(task), "softmax_f32"))
    assert set(found) == {"softmax_f32 initial", "softmax_f32 reference"} | (
        {"softmax_f32 reference as a candidate"} if kept else set())
    assert found["softmax_f32 reference"].launch == task.own_launch("reference")
    if kept:
        assert found["softmax_f32 reference as a candidate"].launch == task.launch
    else:
        assert ("softmax_f32 reference as a candidate: left out, wrong under the candidates' launch "
                "(unwritten_output)") in capsys.readouterr().out
