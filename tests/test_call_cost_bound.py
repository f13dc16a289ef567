"""bench/call_cost.py --record-attempt: the three numbers of record_attempt's bound and the audits' bound, in words;
without a GPU it says so and exits with status 2."""

import pytest

from bench import call_cost
from harness.device import gpu_absent_reason

COST = {"record_attempt_s": 2.41, "compile_s": 0.07, "gpu_busy_s": 1.52, "gpu_busy_source": "kernel clock, every job",
        "bound_s": 2.346, "within_bound": False, "audit_escape_bound": {"square-2048": 2.0 ** -20, "rect": None}}


def test_the_lines_give_the_three_terms_the_bound_and_each_cases_audit_bound():
    first, square, rect = call_cost.attempt_lines(COST)
    assert first == ("record_attempt 2.41 s against compile 0.07 s + 1.3 x GPU busy 1.52 s (kernel clock, every job) "
                     "+ 0.3 s = 2.35 s: over")
    assert square.endswith("square-2048: a kernel wrong on most timed launches passes every audit with a chance of "
                           "at most 9.54e-07")
    assert rect.endswith("(not audited)")
    assert call_cost.attempt_lines({**COST, "within_bound": True})[0].endswith(": within")


@pytest.mark.skipif(gpu_absent_reason() is None, reason="a GPU is here: the bench would run")
def test_without_a_gpu_record_attempt_exits_with_status_two(capsys):
    assert call_cost.main(["--record-attempt"]) == 2
    assert "there is none here" in capsys.readouterr().err
