"""The demo's scripted agent plays whole audit-service runs over their streamable-HTTP MCP endpoints, with the
service's fake executor: bench/service_gpu.py's `measure` end to end (two runs submitted together sharing one fake
GPU through the queue, then one alone) and its report's numbers. The fake executor reads verdicts and latencies
from markers in the source (tests/fake_executor.py), so the demo's kernels carry markers that give verdicts of
every kind (the edge bug a mismatch); the one that does not compile fails NVRTC for real."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from bench.service_gpu import ServiceUnderTest, compare_spread, measure, summary_lines
from harness.gpu_lease import LEASE_DIR_ENV
from server.demo import PLAN, Step
from tests.server_support import free_port
from tests.service_support import REPO

# The naive kernel keeps the baseline's 100 us (valid, not faster); each verdict is against the best so far.
MARKS = {"tiled 32x32": ("latency_us=70",), "register-blocked 128x128": ("latency_us=40",),
         "edge bug (k tail dropped)": ("wrong",), "register-blocked 64x128": ("latency_us=35",),
         "register-blocked 64x64": ("latency_us=45",)}
VERDICTS = {"baseline": "baseline", "naive": "valid-not-faster", "tiled 32x32": "valid-faster",
            "register-blocked 128x128": "valid-faster", "edge bug (k tail dropped)": "rejected",
            "does not compile": "rejected", "register-blocked 64x128": "valid-faster",
            "register-blocked 64x64": "valid-not-faster"}
PERFORMANCE_CASES = {"square-2048", "rect-2000x1500x1000"}


@dataclass(frozen=True)
class MarkedStep(Step):
    """A step of the demo's plan whose source carries the fake executor's markers."""

    marks: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return super().source + "".join(f"\n// fake: {mark}" for mark in self.marks) + "\n"


FAKE_PLAN = tuple(MarkedStep(s.label, s.file, s.launch, s.options, s.rationale, MARKS.get(s.label, ())) for s in PLAN)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    work = tmp_path_factory.mktemp("service-demo")
    root, port = work / "service", free_port()
    # Its own GPU leases: no other test's service holds the one fake GPU.
    env = {LEASE_DIR_ENV: str(work / "gpu-leases")}
    lines: list[str] = []
    command = [sys.executable, str(REPO / "tests" / "fake_service.py"), str(root), str(port), "1"]
    kept: list[dict] = []
    with ServiceUnderTest(command, root, port, env=env) as service:
        measured = measure(service, FAKE_PLAN, lines.append, patience_s=400, keep=kept.append)
    assert [[r["role"] for r in part["runs"]] for part in kept] == [["shared-1", "shared-2"]]  # before the alone run
    assert kept[0]["incomplete"] and kept[0]["runs"] == measured["runs"][:2]
    return measured, lines


@pytest.mark.timeout(600)
def test_every_check_of_the_bench_holds_on_the_fake_service(report):
    measured, _ = report
    assert measured["checks"] == {"every_agent_played_whole": True, "every_budget_spent": True,
                                  "every_run_verifies": True, "shared_through_the_queue": True,
                                  "shared_cv_no_worse": True}, measured["runs"]
    assert [r["role"] for r in measured["runs"]] == ["shared-1", "shared-2", "alone"]
    assert measured["plan"] == [step.label for step in PLAN]


@pytest.mark.timeout(600)
def test_each_run_records_the_plans_seven_attempts_with_their_verdicts(report):
    measured, _ = report
    for run in measured["runs"]:
        assert run["state"] == "finished" and run["agent_error"] is None
        assert (run["budget"]["used"], run["budget"]["left"]) == (7, 0), run["budget"]
        by_label = {a["label"]: a for a in run["attempts"]}
        assert [a["attempt"] for a in run["attempts"]] == list(range(8))
        assert {label: a["verdict"] for label, a in by_label.items()} == VERDICTS
        assert by_label["edge bug (k tail dropped)"]["reasons"][0] == "mismatch"
        assert by_label["does not compile"]["reasons"] == ["compile_error"]
        assert by_label["register-blocked 128x128"]["speedup_vs_baseline"] == pytest.approx(2.5, rel=0.05)


@pytest.mark.timeout(600)
def test_the_second_run_waits_in_the_queue_while_the_first_plays(report):
    measured, lines = report
    first, second, alone = measured["runs"]
    # queued while the first held the GPU, admitted once the first let it go
    assert first["started_at"] <= second["queued_at"] < first["finished_at"] <= second["started_at"]
    assert second["queue_wait_s"] > 0
    assert second["wall_s"] > second["queue_wait_s"] and alone["queue_wait_s"] <= 2
    assert any(line.startswith("[shared-2] the run is being prepared (queued for a GPU: position 1")
               for line in lines), [line for line in lines if line.startswith("[shared-2]")][:5]
    assert any(line.startswith("[shared-1] [7/7] register-blocked 64x64: record_attempt: attempt 7 ")
               for line in lines)


@pytest.mark.timeout(600)
def test_the_cvs_are_the_timed_launches_spread_and_compared_case_by_case(report):
    measured, _ = report
    for run in measured["runs"]:
        assert set(run["case_cv"]) == PERFORMANCE_CASES
        assert all(0.001 < cv < 0.006 for cv in run["case_cv"].values()), run["case_cv"]  # the fake's 0.3% noise
        timed = [a for a in run["attempts"] if a["cv"]]
        assert [a["label"] for a in timed] == ["baseline", "naive", "tiled 32x32", "register-blocked 128x128",
                                               "register-blocked 64x128", "register-blocked 64x64"]
    assert {(row["run"], row["case"]) for row in measured["spread"]} == {
        (run, case) for run in ("shared-1", "shared-2") for case in PERFORMANCE_CASES}
    assert any(line.startswith("shared-2 square-2048: CV ") and line.endswith("no worse")
               for line in summary_lines(measured))


def test_a_shared_run_spread_three_times_wider_is_worse():
    alone = {"role": "alone", "case_cv": {"a": 0.004, "b": 0.010}}
    shared = {"role": "shared-1", "case_cv": {"a": 0.0059, "b": 0.030}}
    rows = compare_spread([shared], alone)
    assert [(row["case"], row["no_worse"]) for row in rows] == [("a", True), ("b", False)]
    assert rows[1]["limit"] == pytest.approx(0.010 * 1.25 + 0.001)
    missing = compare_spread([{"role": "shared-2", "case_cv": {}}], alone)
    assert not any(row["no_worse"] for row in missing)  # a case the shared run never timed is not "no worse"
