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


def test_where_the_host_s_time_went_is_a_line_of_its_own():
    jobs = [{"op": "time", "phases_s": {"setup": 0.1, "read_back": 0.02}}, {"op": "run", "phases_s": None},
            {"op": "time", "phases_s": {"setup": 0.05, "evidence": 0.3}}]
    phases = call_cost.summed_phases(jobs)
    assert phases == {"setup": 0.15, "read_back": 0.02, "evidence": 0.3}
    cost = {**COST, "host_s": 0.82, "worker_jobs": 3, "worker_phases_s": phases,
            "executor_calls": {"check": {"calls": 2, "wall_s": 0.41}, "time": {"calls": 1, "wall_s": 1.9}}}
    first, host, square, rect = call_cost.attempt_lines(cost)
    assert host == ("  host 0.82 s beyond compile and GPU busy; the 3 worker jobs' phases: setup 0.150 s, read_back "
                    "0.020 s, evidence 0.300 s; the executor's calls: check 0.410 s (2), time 1.900 s (1)")


@pytest.mark.skipif(gpu_absent_reason() is None, reason="a GPU is here: the bench would run")
def test_without_a_gpu_record_attempt_exits_with_status_two(capsys):
    assert call_cost.main(["--record-attempt"]) == 2
    assert "there is none here" in capsys.readouterr().err
