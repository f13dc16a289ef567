"""Large cases' inputs are drawn on the device from a key of their seed: none is made on the host or sent, the
reference and the candidate draw the same values, a kernel that changes one is caught, and the oracle gets the
same values drawn on the host."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from harness.drawn_inputs import case_draws, draw_key, host_draws
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from harness.worker_side import fresh_inputs
from sandbox.pool import Worker

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
CUBIN = b"\x7fELF" + bytes(60)


@pytest.fixture(scope="module")
def task():
    return load_task(MATMUL)


def test_only_cases_that_large_are_drawn(task):
    sizes = {c.name: sum(task.nbytes(c.dims)[p.name] for p in task.input_params) for c in task.cases}
    threshold = sorted(sizes.values())[-1]
    drawn = [c.name for c in task.cases if case_draws(task, c, threshold) is not None]
    assert drawn == [name for name, size in sizes.items() if size >= threshold] and drawn
    assert all(case_draws(task, c, None) is None for c in task.cases)
    spec = case_draws(task, task.cases[0], 0)["a"]
    assert spec == fresh_inputs.draw_spec(task.inputs["a"].kind, "float32", task.inputs["a"].low,
                                          task.inputs["a"].high, task.inputs["a"].mean, task.inputs["a"].std)


def test_draw_keys_differ_by_seed_and_host_draws_are_the_generators(task):
    assert draw_key(1) == draw_key(1) != draw_key(2)
    case = task.visible_cases[0]
    draws = case_draws(task, case, 0)
    arrays = host_draws(task, case, 7, draws)
    shape = task.shapes(case.dims)["b"]
    words = fresh_inputs.draw_on_host(draws["b"], shape[0] * shape[1], fresh_inputs.launch_key(draw_key(7), 0), 1)
    assert np.array_equal(arrays["b"], words.view(np.float32).reshape(shape))
    assert not np.array_equal(arrays["a"], host_draws(task, case, 8, draws)["a"])


class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference, self.candidate = reference, candidate


@pytest.fixture
def pool(tmp_path, request):
    folder = f"--ipc-dir={tmp_path}"
    pool = _Pool(Worker("reference", command=FAKE_GPU + (folder,), confine=False, startup_timeout_s=30),
                 Worker("candidate", command=FAKE_GPU + (f"--behaviour={request.param}", folder), confine=False,
                        startup_timeout_s=30))
    yield pool
    pool.reference.stop()
    pool.candidate.stop()


def _referee(task, pool, device: bool) -> Referee:
    settings = TimingSettings(run_deadline_s=60.0, draw_inputs_from_bytes=0,
                              device_judging_from_bytes=0 if device else None)
    return Referee(task, pool, CompiledKernel("reference", CUBIN, task.kernel_name, task.launch), settings)


def _kernel(task):
    return CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch)


@pytest.mark.parametrize("pool", ["honest"], indirect=True)
@pytest.mark.parametrize("device", [False, True], ids=["judged-on-the-host", "judged-on-the-device"])
def test_drawn_inputs_check_and_send_nothing(task, pool, device):
    referee = _referee(task, pool, device)
    case = task.visible_cases[0]
    report = referee.check(_kernel(task), [case])
    assert report.passed, report.reasons
    assert referee.inputs(case, case.seed) == ({}, {})
    assert referee.judged_on_device == int(device)


@pytest.mark.parametrize("pool", ["modify_input"], indirect=True)
@pytest.mark.parametrize("device", [False, True], ids=["judged-on-the-host", "judged-on-the-device"])
def test_a_kernel_that_changes_a_drawn_input_is_caught(task, pool, device):
    report = _referee(task, pool, device).check(_kernel(task), [task.visible_cases[0]])
    assert not report.passed
    assert any(r.code.value == "input_modified" and "a" in r.detail for r in report.reasons)


@pytest.mark.parametrize("pool", ["honest"], indirect=True)
def test_the_oracle_sees_the_values_the_device_draws(task, pool):
    referee = _referee(task, pool, device=False)
    holdout = task.holdout_cases[0]
    assert referee.check(_kernel(task), [holdout], against_oracle=True).passed


@pytest.mark.parametrize("pool", ["honest"], indirect=True)
def test_a_large_case_is_timed_on_fresh_inputs_even_where_rotated_sets_are_asked_for(task, pool):
    settings = TimingSettings(warmups=2, iterations=20, run_deadline_s=60.0, draw_inputs_from_bytes=0,
                              fresh_inputs=False)
    referee = Referee(task, pool, CompiledKernel("reference", CUBIN, task.kernel_name, task.launch), settings)
    report = referee.time(_kernel(task), [task.performance_cases[-1]])
    assert report.passed and report.cases[0].inputs == "fresh"
