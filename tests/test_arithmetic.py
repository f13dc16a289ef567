"""The arithmetic a task allows (harness/arithmetic.py): the task field, the rule on instruction mixes, the compute
peak a kernel is held to, and the rule through the real tools with the fake executor (real NVRTC and nvdisasm)."""

from __future__ import annotations

import shutil
from html import escape
import tempfile
from pathlib import Path

import pytest

from harness.arithmetic import arithmetic_reason, compute_kind
from harness.results import ReasonCode
from harness.task import load_task
from harness.task_model import TaskError
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.sass_mix import InstructionMix, instruction_mix
from server.cli import main
from server.report import load_report
from server.report_files import write_report
from server.suspicion import physical_limit_checks
from tests.fake_executor import H200_ENVIRONMENT
from tests.server_support import INITIAL, MATMUL, client, kernel, ok, refused
from tests.test_new_task import CASES, cases_file, new_task_args

REPO = Path(__file__).resolve().parents[1]
SPLIT = (REPO / "tests" / "exploits" / "split_precision_gemm.cu").read_text()
SPLIT_LAUNCH = {"grid": ["ceil_div(n, 8)", "ceil_div(m, 16)"], "block": [32]}

CORES = InstructionMix(instructions=100, fp32=64)
HALF2 = InstructionMix(instructions=100, fp32=8, half2=64)
BF16 = InstructionMix(instructions=100, fp32=8, tensor={"bf16": 4}, tensor_forms=["HMMA.16816.F32.BF16"])
FP16_TF32 = InstructionMix(instructions=100, tensor={"fp16": 3, "tf32": 1},
                           tensor_forms=["HMMA.16816.F32", "HMMA.1688.F32.TF32"])


@pytest.fixture(scope="module")
def split_mix() -> InstructionMix:
    compiled = compile_kernel(SPLIT, "matmul_f32", arch="sm_90")
    assert compiled.ok, compiled.log
    with tempfile.TemporaryDirectory() as scratch:
        return instruction_mix(compiled.cubin, Path(scratch))


def test_the_split_precision_gemm_computes_on_fp16_tensor_cores(split_mix):
    assert split_mix.tensor == {"fp16": 3} and split_mix.tensor_forms == ["HMMA.16816.F32"]
    reason = arithmetic_reason(load_task(MATMUL).arithmetic, split_mix)
    assert reason.code == ReasonCode.ARITHMETIC_NOT_ALLOWED
    assert "3 fp16 tensor-core MMA (HMMA.16816.F32)" in reason.detail and "CUDA cores only" in reason.detail
    assert arithmetic_reason("any", split_mix) is None and arithmetic_reason(("fp16",), split_mix) is None
    assert arithmetic_reason(("bf16",), split_mix).code == ReasonCode.ARITHMETIC_NOT_ALLOWED


@pytest.mark.parametrize("arithmetic, mix, forbidden", [
    ("cuda-cores", CORES, None), ("cuda-cores", HALF2, None), ("cuda-cores", BF16, "bf16"),
    ("any", FP16_TF32, None), (("bf16",), BF16, None), (("bf16",), FP16_TF32, "fp16"),
    (("fp16",), FP16_TF32, "tf32"), (("fp16", "tf32"), FP16_TF32, None),
    ("cuda-cores", None, "not read"), (("bf16",), None, "not read"), ("any", None, None),
])
def test_the_rule_names_what_it_forbids(arithmetic, mix, forbidden):
    reason = arithmetic_reason(arithmetic, mix)
    if forbidden is None:
        assert reason is None
    else:
        assert reason.code == ReasonCode.ARITHMETIC_NOT_ALLOWED and forbidden in reason.detail


@pytest.mark.parametrize("mix, kind", [(CORES, "fp32"), (HALF2, "half2"), (BF16, "tensor_bf16"),
                                       (FP16_TF32, "tensor_fp16"), (None, "tensor_bf16")])
def test_the_compute_peak_is_that_of_the_fastest_unit_used(mix, kind):
    assert compute_kind(mix, declared="tensor_bf16") == kind


def test_a_tensor_core_kernel_is_held_to_the_tensor_peak_not_the_fp32_one(split_mix):
    task = load_task(MATMUL)
    square = next(c for c in task.performance_cases if c.name == "square-2048")
    fp32_ms = task.flops(square.dims) / 66.9e12 * 1e3  # the H200's fp32 peak: 0.257 ms
    stats = {square.name: {"median_ms": fp32_ms / 3}}  # three times the CUDA cores' peak
    as_cores = physical_limit_checks(task, H200_ENVIRONMENT, stats, CORES)
    as_tensor = physical_limit_checks(task, H200_ENVIRONMENT, stats, split_mix)
    assert [(c.kind, c.beyond) for c in as_cores if c.kind != "memory"] == [("fp32", True)]
    assert [(c.kind, c.beyond) for c in as_tensor if c.kind != "memory"] == [("tensor_fp16", False)]
    assert as_tensor[-1].peak.peak == pytest.approx(132 * 4096 * 1.98e9 / 1e12)  # 1070 TFLOP/s
    assert physical_limit_checks(task, H200_ENVIRONMENT, stats)[-1].kind == "fp32"  # no mix: cost.compute


def _task_with(tmp_path: Path, line: str | None, compute: str | None = None) -> Path:
    folder = tmp_path / "task"
    shutil.copytree(MATMUL, folder)
    text = (folder / "task.toml").read_text()
    text = text.replace('arithmetic = "cuda-cores"\n', f"{line}\n" if line else "")
    if compute:
        text = text.replace('compute = "fp32"', f'compute = "{compute}"')
    (folder / "task.toml").write_text(text)
    return folder


@pytest.mark.parametrize("line, expected", [(None, "cuda-cores"), ('arithmetic = "any"', "any"),
                                            ('arithmetic = ["bf16", "tf32"]', ("bf16", "tf32"))])
def test_the_task_field_and_its_protective_default(tmp_path, line, expected):
    assert load_task(_task_with(tmp_path, line)).arithmetic == expected


@pytest.mark.parametrize("line, compute, words", [
    ('arithmetic = "gpu"', None, "arithmetic"), ('arithmetic = ["fp17"]', None, "arithmetic"),
    ("arithmetic = []", None, "empty list"), ('arithmetic = ["bf16", "bf16"]', None, "twice"),
    ('arithmetic = "cuda-cores"', "tensor_bf16", "forbids the tensor cores"),
])
def test_a_task_whose_arithmetic_makes_no_sense_is_refused(tmp_path, line, compute, words):
    with pytest.raises(TaskError, match=words):
        load_task(_task_with(tmp_path, line, compute))


def test_every_shipped_task_states_its_arithmetic():
    for folder in sorted((REPO / "cases").iterdir()):
        if (folder / "task.toml").is_file():
            assert "\narithmetic = " in (folder / "task.toml").read_text(), folder.name
    assert load_task(REPO / "cases" / "matmul_bf16").arithmetic == ("bf16",)


@pytest.mark.anyio
async def test_a_forbidden_kernel_is_rejected_by_every_tool_before_it_runs(run):
    async with client(run) as c:
        compiled = await ok(c, "compile_kernel", source=SPLIT, launch=SPLIT_LAUNCH)
        assert compiled["ok"] is True and compiled["mix"]["tensor"] == {"fp16": 3}
        assert compiled["rejected"]["code"] == "arithmetic_not_allowed"
        honest = await ok(c, "compile_kernel", source=kernel("latency_us=50"))
        assert honest["rejected"] is None and honest["mix"]["tensor"] == {} and honest["mix"]["fp32"] > 0
        checks_before = run.executor.calls.count("check")
        for tool in ("validate", "time_kernel"):
            message = await refused(c, tool, candidate_id=compiled["candidate"])
            assert "arithmetic_not_allowed" in message and "HMMA.16816.F32" in message
        answer = await ok(c, "record_attempt", candidate_id=compiled["candidate"], rationale="float32 on tensor cores")
        assert answer["verdict"] == "rejected" and [r["code"] for r in answer["reasons"]] == ["arithmetic_not_allowed"]
        assert answer["mix"]["tensor"] == {"fp16": 3} and answer["budget"]["attempts_left"] == 6  # the attempt is spent
        assert run.executor.calls.count("check") == checks_before  # never run
    assert run.history[-1].compile.mix.tensor == {"fp16": 3}
    shown = load_report(run.dir).attempts[-1].arithmetic
    assert shown.endswith("tensor cores: 3 fp16 (HMMA.16816.F32)")
    write_report(run.dir)
    assert escape(shown) in (run.dir / "report.html").read_text()


def test_the_task_s_own_initial_kernel_is_not_held_to_the_rule(run):
    baseline = run.candidates[run.history[0].candidate]
    assert baseline.source == INITIAL and run.history[0].compile.mix is not None


@pytest.mark.parametrize("given, written", [(None, 'arithmetic = "cuda-cores"'), (["tf32"], 'arithmetic = ["tf32"]')])
def test_new_task_always_writes_the_arithmetic(tmp_path, given, written):
    cases = CASES if given is None else {**CASES, "arithmetic": given}
    folder = tmp_path / "matmul"
    assert main(new_task_args(folder, cases_file(tmp_path, cases))) == 0
    assert written in (folder / "task.toml").read_text().splitlines()
    assert load_task(folder).arithmetic == (tuple(given) if given else "cuda-cores")
