"""`kernel-referee guard STORE` end to end on the CPU: a signed store of fake-marked kernels, the real store check,
the real correctness checks and verdicts, the fake executor standing in for the GPU."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from guard import cli, history
from guard.fingerprint import Fingerprint
from guard.measure import GuardStep, merged_watch, subject_of
from guard.run import GuardOptions, run_guard
from guard.step import guard_approval
from guard.store import READABLE, load_approval, load_store
from guard.verdict import Verdict, VerdictSettings
from harness.nvml import GpuState, GpuWatch
from tests.fake_executor import FakeExecutor, Fp16TensorCoreToolchain
from tests.guard_fake_store import add_approval, fake_fingerprint, new_store

QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)


def fake(approval):
    return lambda task, timing: FakeExecutor(task)


def guard(store, **options) -> tuple[int, str]:
    out = io.StringIO()
    code = run_guard(GuardOptions(store=store, make_executor=options.pop("make_executor", fake), settings=QUICK,
                                  **options), out)
    return code, out.getvalue()


@pytest.fixture
def store(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    add_approval(store, key, "softmax", "softmax_f32", 40)
    return store, key


def test_unchanged_approvals_pass_on_every_case(store):
    code, out = guard(store[0], json=store[0].parent / "out" / "guard.json")
    assert code == 0, out
    assert "2 approval(s) verified: matmul, softmax" in out
    assert out.count(": pass, ") == 4 and "since approval" in out  # two performance cases each
    assert "FAIL" not in out
    document = json.loads((store[0].parent / "out" / "guard.json").read_text())
    assert document["exit_status"] == 0 and [r["approval"] for r in document["results"]] == ["matmul", "softmax"]
    assert all(r["node"] and r["fingerprint"]["gpu"] == "Fake GPU" for r in document["results"])
    assert (store[0].parent / "out" / "trend-matmul.svg").is_file()
    assert [r.approval for r in history.read(store[0], "matmul")] == ["matmul"]
    code, out = guard(store[0])
    assert code == 0 and out.count("previous run +0.0%") + out.count("previous run -0.0%") == 4, out
    assert len(history.read(store[0], "softmax")) == 2


def test_a_kernel_3_percent_slower_is_regressed_naming_the_change(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, now_us=51.5)
    code, out = guard(store)
    assert code == 1, out
    result = guard_approval(load_approval(store, "matmul"), fake(None), QUICK)
    assert [v.verdict for v in result.verdicts] == [Verdict.REGRESSED] * 2
    assert all(1.025 < v.change.estimate < 1.035 for v in result.verdicts)
    assert result.cost.rounds == QUICK.min_rounds  # decided at once: no repeat


def test_a_kernel_wrong_on_fresh_values_is_incorrect_and_not_timed(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, marker="wrong-fresh")
    code, out = guard(store)
    assert code == 1 and "incorrect: mismatch (failed: fresh-oracle odd-31x37x29" in out
    assert "FAIL fresh-oracle square-2048: mismatch" in out
    result = guard_approval(load_approval(store, "matmul"), fake(None), QUICK)
    assert {v.verdict for v in result.verdicts} == {Verdict.INCORRECT}
    assert result.cost.rounds == 0 and result.cost.timing_s == 0
    assert [c.kind for c in result.checks if not c.passed] == ["fresh-oracle"] * 4


def test_a_kernel_that_fails_its_own_timing_is_incorrect(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, marker="unwritten")
    result = guard_approval(load_approval(store, "matmul"), fake(None), QUICK)
    assert {v.verdict for v in result.verdicts} == {Verdict.INCORRECT}
    assert any(c.name == "timing of the candidate" and "unwritten_output" in c.reasons[0] for c in result.checks)


@pytest.mark.parametrize("passes, fails", [
    ({"accepted_us": 40}, {"accepted_us": 40, "marker": "two-paced"}),
    # the task's own kernel is known by its source, not by the attempt number it carries
    ({"accepted_us": 100, "own_kernel": True}, {"accepted_us": 40, "marker": "two-paced", "attempt": 0})])
def test_a_baseline_at_two_paces_is_a_yardstick_and_a_kernel_at_two_paces_is_incorrect(tmp_path, passes, fails):
    store, key = new_store(tmp_path)
    add_approval(store, key, "passes", "softmax_f32", **passes)
    add_approval(store, key, "fails", "softmax_f32", **fails)
    two_paced = lambda task, timing: FakeExecutor(task, two_paced_baseline=True)  # noqa: E731
    result = guard_approval(load_approval(store, "passes"), two_paced, QUICK)
    assert [v.verdict for v in result.verdicts] == [Verdict.PASS] * 2, result.checks
    waived = {"baseline", "candidate"} if passes.get("own_kernel") else {"baseline"}
    assert set(result.shape_waived) == waived  # what was taken past is kept, once per round and case
    for label in waived:
        assert set(result.shape_waived[label]) == {v.case for v in result.verdicts}
        for verdict in result.verdicts:
            reasons = result.shape_waived[label][verdict.case]
            assert len(reasons) == verdict.rounds and all(r.startswith("timing_modes: ") for r in reasons)
    result = guard_approval(load_approval(store, "fails"), two_paced, QUICK)
    assert {v.verdict for v in result.verdicts} == {Verdict.INCORRECT}
    assert any(c.name == "timing of the candidate" and "timing_modes" in c.reasons[0] for c in result.checks)


def test_a_yardstick_taken_past_its_shape_is_said_and_kept_in_the_json(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "softmax", "softmax_f32", 40)
    two_paced = lambda approval: lambda task, timing: FakeExecutor(task, two_paced_baseline=True)  # noqa: E731
    report = tmp_path / "out" / "guard.json"
    code, out = guard(store, json=report, make_executor=two_paced)
    assert code == 0, out
    document = json.loads(report.read_text())
    waived = document["results"][0]["shape_waived"]
    assert list(waived) == ["baseline"] and len(waived["baseline"]) == 2  # both performance cases
    said = [line for line in out.splitlines() if "the baseline's timing taken as measured" in line]
    assert len(said) == 2 and all("timing_modes: " in line for line in said), out
    code, out = guard(store, html=tmp_path / "out" / "guard.html", make_executor=two_paced)
    assert code == 0, out
    page = (tmp_path / "out" / "guard.html").read_text()
    assert "taken as measured past their launches&#x27; shape (yardsticks)" in page  # escaped, as every value
    assert page.count("the baseline&#x27;s on ") == 2 and "in 8 round(s)" in page
    code, out = guard(store, junit=tmp_path / "out" / "guard.xml", make_executor=two_paced)
    assert code == 0, out
    said = [p.get("value") for p in ET.parse(tmp_path / "out" / "guard.xml").iter("property")
            if p.get("name") == "shape_waived"]
    assert len(said) == 2 and all(v.startswith("the baseline's on ") and "timing_modes: " in v for v in said), said
    runs = history.read(store, "softmax")
    assert [c.shape_waived for c in runs[-1].cases] == [{"baseline": 8}] * 2  # every round of both cases
    code, out = guard(store, json=report)  # an even baseline: nothing taken past, nothing said
    assert code == 0 and json.loads(report.read_text())["results"][0]["shape_waived"] == {}
    assert [c.shape_waived for c in history.read(store, "softmax")[-1].cases] == [{}, {}]
    assert "taken as measured" not in out


def test_a_kernel_compiled_onto_units_its_task_forbids_is_incorrect_and_not_timed(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    result = guard_approval(load_approval(store, "matmul"), lambda task, timing: Fp16TensorCoreToolchain(task), QUICK)
    assert {v.verdict for v in result.verdicts} == {Verdict.INCORRECT}
    failed = [c for c in result.checks if not c.passed]
    assert [c.kind for c in failed] == ["arithmetic"] and "3 fp16 tensor-core MMA" in failed[0].reasons[0]
    assert result.cost.rounds == 0


class SharedGpu(FakeExecutor):
    """A GPU on which another process (pid 4242) holds a context during every timing job."""

    def time(self, kernel, cases):
        report = super().time(kernel, cases)
        busy = GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980, processes=[4242])
        watch = GpuWatch(before=busy, after=busy, other_processes=[4242]).model_dump(mode="json")
        return report.model_copy(update={"cases": [c.model_copy(update={"gpu": watch}) for c in report.cases]})


def test_another_process_on_the_gpu_leaves_it_inconclusive_after_the_bound(store):
    code, out = guard(store[0], only=["matmul"], make_executor=lambda approval: lambda t, s: SharedGpu(t))
    assert code == 4, out
    assert out.count("inconclusive (other_process)") == 2
    result = guard_approval(load_approval(store[0], "matmul"), lambda t, s: SharedGpu(t), QUICK)
    assert all(v.rounds == QUICK.max_rounds and v.rounds_kept == 0 for v in result.verdicts)
    assert result.cost.rounds == QUICK.min_rounds + 2 * (QUICK.max_rounds - QUICK.min_rounds)  # extra rounds per case


def test_a_round_merges_the_readings_of_its_two_jobs():
    idle = GpuState(sm_clock_mhz=345, max_sm_clock_mhz=1980, throttle=["gpu_idle"])
    slow = GpuState(sm_clock_mhz=1500, max_sm_clock_mhz=1980, throttle=["hw_slowdown"])
    full = GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980)
    merged = merged_watch([GpuWatch(before=idle, after=full), GpuWatch(before=full, after=slow, other_processes=[7])])
    assert merged.before.throttle == ["gpu_idle", "hw_slowdown"] and merged.other_processes == [7]
    assert merged.after.sm_clock_mhz == 1500 and "gpu_idle" not in merged.after.throttle
    assert merged_watch([]) is None


def test_rounds_alternate_which_kernel_goes_first_and_hold_the_lease(store):
    order = []

    class Recording(FakeExecutor):
        def time(self, kernel, cases):
            assert self.gpu_lease.holder() is not None  # the round's own hold, around both jobs
            order.append(kernel.label)
            return super().time(kernel, cases)

    loaded = load_approval(store[0], "matmul")
    with GuardStep(subject_of(loaded), lambda t, s: Recording(t)) as step:
        step.round()
        step.round(["square-2048"])
    assert order == ["attempt-1", "attempt-0", "attempt-0", "attempt-1"]
    assert step.cost.rounds == 2 and step.cost.total_s >= step.cost.timing_s > 0
    assert not list(loaded.folder.rglob("__pycache__"))  # the oracle was imported from the signed task copy


def test_accept_resigns_a_passing_run_on_a_new_environment(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, fingerprint=fake_fingerprint("matmul_f32", nvrtc="12.9"))
    code, out = guard(store, accept=True, key=key)
    assert code == 0 and "environment differs from the approval's: nvrtc: '12.9' -> '13.x'" in out
    assert "matmul: accepted this run as the new baseline (nvrtc: '12.9' -> '13.x'), signed again" in out, out
    approval = load_store(store)[0].approval  # verifies: signed again over the new approval.json
    assert approval.fingerprint.nvrtc == "13.x" and "guard --accept" in approval.provenance.note
    assert json.loads((store / "approvals" / "matmul" / READABLE).read_text())["fingerprint"]["nvrtc"] == "13.x"
    assert all(0.45 < c.kernel.median_ms / c.baseline.median_ms < 0.55 for c in approval.cases)
    code, out = guard(store, accept=True, key=key)
    assert code == 0 and "matmul: nothing to accept: the environment is the approval's" in out


def test_accept_leaves_a_failing_run_alone(tmp_path):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50, now_us=51.5,
                 fingerprint=fake_fingerprint("matmul_f32", nvrtc="12.9"))
    before = (store / "approvals" / "matmul" / READABLE).read_bytes()
    code, out = guard(store, accept=True, key=key)
    assert code == 1 and "matmul: not accepted" in out
    assert (store / "approvals" / "matmul" / READABLE).read_bytes() == before


def test_the_command_refuses_a_changed_store_and_a_host_without_gpu(store, capsys):
    assert cli.main(["guard", str(store[0])]) == 3
    assert "kernel-referee guard needs an NVIDIA GPU" in capsys.readouterr().err
    kernel = store[0] / "approvals" / "softmax" / "kernel.cu"
    kernel.write_text(kernel.read_text() + "\n")
    assert cli.main(["guard", str(store[0])]) == 2
    assert "softmax: kernel.cu: changed" in capsys.readouterr().err


def test_the_fingerprint_recorded_is_this_nodes(store):
    result = guard_approval(load_approval(store[0], "softmax"), fake(None), QUICK)
    assert isinstance(result.fingerprint, Fingerprint) and result.fingerprint.gpu == "Fake GPU"
    assert result.environment_changes == [] and result.node
