"""Outputs judged on the device give the host path's verdicts, on the real workers: the exploit corpus's
checkable kernels, the honest reference and the wrong ones, each checked both ways; the reference's outputs
kept on the device hash (sha256-tree, computed there) to the host's hash of the same outputs."""

import re
from pathlib import Path

import pytest

from harness.referee import Referee
from harness.results import ReasonCode
from harness.settings import TimingSettings
from harness.task_model import LaunchSpec
from harness.worker_side import buffers
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu
GUARD_DETAIL = re.compile(r"(\w+): \d+ bytes changed (before the start|after the end) \(nearest \d+ bytes away\)")
EXPLOITS = Path(__file__).resolve().parents[1] / "exploits"
TILED32 = {"grid": ["ceil_div(n, 32)", "ceil_div(m, 32)"], "block": [32, 32]}
# Checked both ways: their verdicts come from the outputs (and guard bands and inputs), not from a worker
# that dies; those that kill or stall the worker end the same way on either path before any judging.
CHECKED = ["correct_control", "wrong_control", "writes_nothing", "partial_output", "half_precision",
           "oob_write_after", "oob_write_before", "write_input", "zero_inputs", "visible_shapes_only",
           "memo_pointer", "memo_sampled_values", "memo_whole_input_hash", "launch_counter_skip",
           "recompute_on_change"]


@pytest.fixture(scope="module")
def referees(matmul_task, pool, arch):
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference")
    host = Referee(matmul_task, pool, reference, TimingSettings(device_judging_from_bytes=None))
    device = Referee(matmul_task, pool, reference, TimingSettings(device_judging_from_bytes=0))
    return host, device


def _verdict(report) -> list[str]:
    """The cases as JSON, but for how many guard bytes changed and how near: each check draws its own
    canaries, and a byte written with its canary's value does not show."""
    return [GUARD_DETAIL.sub(r"\1: N bytes changed \2", case.model_dump_json(exclude={"judged_on"}))
            for case in report.cases]


@pytest.mark.parametrize("name", CHECKED)
def test_an_exploit_gets_the_same_verdict_on_the_device_as_on_the_host(matmul_task, arch, referees, name):
    host, device = referees
    path = EXPLOITS / f"{name}.cu"
    if not path.exists():
        pytest.fail(f"{path} is gone: update CHECKED")
    launch = LaunchSpec.model_validate(TILED32) if name == "correct_control" else None
    kernel = build(path.read_text(), matmul_task, arch, launch=launch)
    cases = list(matmul_task.visible_cases) + list(matmul_task.holdout_cases)
    judged = device.judged_on_device
    on_device, on_host = device.check(kernel, cases), host.check(kernel, cases)
    assert device.device_off is None, device.device_off
    assert device.judged_on_device > judged
    assert all(c.judged_on == "device" for c in on_device.cases if c.outputs)  # those that got as far as judging
    assert on_device.passed == on_host.passed
    deterministic = all(c.agreement == "identical" for c in on_host.cases + on_device.cases)
    if deterministic:
        assert _verdict(on_device) == _verdict(on_host)
    else:  # a racy kernel's runs may differ from one check to the next (and agree in another): the same reasons
        # but the race, not the same numbers; and each path reports a race exactly where its own runs differed
        assert [_codes_but_race(c) for c in on_device.cases] == [_codes_but_race(c) for c in on_host.cases]
        for case in on_device.cases + on_host.cases:
            assert (ReasonCode.RACE in {r.code for r in case.reasons}) == (case.agreement == "differs"), case


def _codes_but_race(case) -> list:
    return sorted({r.code for r in case.reasons} - {ReasonCode.RACE})


def test_the_reference_passes_on_the_device(matmul_task, referees):
    _, device = referees
    report = device.check(device.reference, list(matmul_task.cases))
    assert report.passed, report.reasons
    assert device.device_off is None


def test_kept_expected_outputs_hash_on_the_device_as_on_the_host(matmul_task, referees):
    host, device = referees
    case = matmul_task.visible_cases[0]
    kept = device._kept_expected(case, case.seed, device.inputs(case, case.seed))
    assert kept is not None
    expected = host.expected(case, case.seed)
    assert kept.tree_sha256 == {name: buffers.tree_sha256(array) for name, array in expected.items()}


@pytest.mark.parametrize("name", ["correct_control", "memo_pointer"])
def test_a_timings_audits_get_the_same_reasons_on_the_device(matmul_task, arch, referees, name):
    host, device = referees
    launch = LaunchSpec.model_validate(TILED32) if name == "correct_control" else None
    kernel = build((EXPLOITS / f"{name}.cu").read_text(), matmul_task, arch, launch=launch)
    cases = list(matmul_task.performance_cases)
    audited = device.audits_on_device
    on_device, on_host = device.time(kernel, cases), host.time(kernel, cases)
    assert device.device_off is None, device.device_off
    assert device.audits_on_device > audited
    assert on_device.passed == on_host.passed
    assert [sorted(r.code.value for r in c.reasons) for c in on_device.cases] == \
           [sorted(r.code.value for r in c.reasons) for c in on_host.cases]


@pytest.mark.parametrize("device", [False, True], ids=["judged-on-the-host", "judged-on-the-device"])
def test_inputs_drawn_on_the_device_check_the_reference_and_catch_a_changed_input(matmul_task, pool, arch, device):
    """Every case's inputs drawn on the device (the large-case path, its threshold lowered to 0)."""
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference")
    settings = TimingSettings(draw_inputs_from_bytes=0, device_judging_from_bytes=0 if device else None)
    referee = Referee(matmul_task, pool, reference, settings)
    cases = list(matmul_task.visible_cases)
    assert referee.check(reference, cases).passed
    assert referee.inputs(cases[0], cases[0].seed) == ({}, {})
    writer = build((EXPLOITS / "write_input.cu").read_text(), matmul_task, arch)
    report = referee.check(writer, cases)
    assert not report.passed and "input_modified" in {r.code.value for r in report.reasons}
    holdout = matmul_task.holdout_cases[0]
    assert referee.check(reference, [holdout], against_oracle=True).passed  # the oracle sees the device's draws
