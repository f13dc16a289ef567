"""The guard's rehearsal copies (guard/variants.py) on the CPU: every shipped float kernel wrapped slower or wrong on
one element still compiles with NVRTC under the task's name and signature; the spin's formula; a copy is an
approval the store verifies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from guard import variants
from guard.store import load_store
from harness.csig import parse_signature
from harness.task import load_task
from harness.worker_side.nvrtc import compile_kernel
from tests.guard_fake_store import CASES, add_approval, fake_fingerprint, new_store

FLOAT_TASKS = ("matmul_f32", "softmax_f32", "layernorm_f32", "transpose_f32")


def wrapper_signature(source: str, kernel_name: str):
    """The signature of the one extern "C" __global__ left in a variant (the wrapper), read as a task's is."""
    [declaration] = re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?'
                               rf'{kernel_name}\s*\([^()]*\)', source)
    return parse_signature(re.sub(r"__launch_bounds__\s*\([^()]*\)\s*", "", declaration))


def same_types(a, b) -> bool:
    return [(p.ctype, p.pointer, p.const) for p in a.params] == [(p.ctype, p.pointer, p.const) for p in b.params]


@pytest.mark.parametrize("file", ["initial.cu", "reference.cu"])
@pytest.mark.parametrize("task_name", FLOAT_TASKS)
def test_both_variants_compile_under_the_tasks_name_and_signature(task_name, file):
    task = load_task(CASES / task_name)
    source = (CASES / task_name / file).read_text()
    expected = parse_signature(task.signature)
    for variant in (variants.slower(source, task.kernel_name, {4096: 1200, 12: 30}),
                    variants.one_wrong_element(source, task)):
        compiled = compile_kernel(variant, task.kernel_name, arch="sm_90")
        assert compiled.ok, compiled.log
        assert compiled.lowered_name == task.kernel_name
        found = wrapper_signature(variant, task.kernel_name)
        assert found.name == task.kernel_name and same_types(found, expected)
        assert f"static __device__ __forceinline__ void {task.kernel_name}{variants.INNER_SUFFIX}(" in variant
        assert source.count("__launch_bounds__") == variant.count("__launch_bounds__")  # moved, not copied


def test_launch_bounds_move_to_the_wrapper_and_the_spin_is_chosen_by_block_count():
    task = load_task(CASES / "softmax_f32")
    variant = variants.slower((CASES / "softmax_f32" / "initial.cu").read_text(), task.kernel_name,
                              {4096: 1200, 12: 30})
    inner, wrapper = variant.split(f'extern "C" __global__ void __launch_bounds__(THREADS) {task.kernel_name}(')
    assert "__launch_bounds__" not in inner.split(f"{task.kernel_name}{variants.INNER_SUFFIX}(")[0].splitlines()[-1]
    assert "case 12LL: spin = 30LL;" in wrapper and "case 4096LL: spin = 1200LL;" in wrapper
    assert "long long spin = 1200LL;" in wrapper  # another block count: the largest
    assert wrapper.index("__syncthreads()") < wrapper.index(f"{variants.INNER_SUFFIX}(x, y, rows, cols)")


def test_the_wrong_element_is_added_after_the_kernel_by_block_0_thread_0_to_the_output():
    task = load_task(CASES / "matmul_f32")
    variant = variants.one_wrong_element((CASES / "matmul_f32" / "initial.cu").read_text(), task)
    tail = variant.split(f"{variants.INNER_SUFFIX}(a, b, c, m, n, k);")[1]
    assert tail.index("__syncthreads()") < tail.index("c[0] += 1.0f;")
    assert "blockIdx.x == 0 && blockIdx.y == 0" in tail and "threadIdx.x == 0" in tail


def test_a_kernel_the_wrapper_cannot_read_is_refused():
    task = load_task(CASES / "matmul_f32")
    half = task.model_copy(update={"params": tuple(p.model_copy(update={"dtype": "bfloat16"}) if p.kind == "output"
                                                   else p for p in task.params)})
    with pytest.raises(variants.VariantError, match="float32 or float64 output, the task's is bfloat16"):
        variants.one_wrong_element((CASES / "matmul_f32" / "initial.cu").read_text(), half)
    with pytest.raises(variants.VariantError, match="found 0"):
        variants.slower("__global__ void other(float* y) {}", "matmul_f32", {1: 1})
    with pytest.raises(variants.VariantError, match="non-negative"):
        variants.slower((CASES / "matmul_f32" / "initial.cu").read_text(), "matmul_f32", {})


def test_the_spin_formula():
    # 3% of 2 ms at 1980 MHz over 4 waves: 0.03 * 2e-3 * 1.98e9 / 4 = 29,700 cycles
    assert variants.spin_cycles(2.0, 1980, 4) == 29_700
    assert variants.spin_cycles(2.0, 1980, 4, share=0.06) == 59_400
    assert variants.waves(16384, 132, 8) == 16 and variants.waves(10, 132, 8) == 1
    assert variants.resident_blocks(256, 32, 2048) == 8  # threads: 2048 / 256
    assert variants.resident_blocks(256, 128, 0) == 2  # registers: 65536 / (128 * 256)
    assert variants.resident_blocks(32, 16, 100 * 1024) == 2  # shared memory: 228 KiB / 100 KiB
    assert variants.resident_blocks(32, 16, 0) == 32  # the blocks-per-SM cap
    assert variants.rescaled(1000, 0.015) == 2000 and variants.rescaled(1000, 0.06) == 500
    with pytest.raises(variants.VariantError):
        variants.rescaled(1000, -0.001)


def test_a_copy_is_a_signed_approval_the_store_verifies_and_its_spin_plan_follows_the_cases(tmp_path):
    store, key = new_store(tmp_path)
    fingerprint = fake_fingerprint("matmul_f32").model_copy(update={"sm_count": 132, "max_sm_clock_mhz": 1980})
    add_approval(store, key, "matmul", "matmul_f32", 2000, fingerprint=fingerprint)
    [loaded] = load_store(store)
    plan = variants.spin_plan(loaded)
    task = load_task(loaded.path("task"))
    launch_blocks = {c.name: c for c in task.performance_cases}
    assert len(plan) == len(launch_blocks) and all(cycles > 0 for cycles in plan.values())
    # square-2048: 128 x 128 blocks of 16 x 16 threads, 8 resident per SM: 16 waves of 2 ms at 1980 MHz
    assert plan[128 * 128] == variants.spin_cycles(2.0, 1980, 16)
    source = variants.slower(loaded.source("kernel.cu"), task.kernel_name, plan)
    copy = variants.copy_with(store, loaded, "matmul-slower", source, key, "3% slower, to rehearse the guard")
    assert [a.name for a in load_store(store)] == ["matmul", "matmul-slower"]
    assert copy.source("kernel.cu") == source and copy.approval.kernel.sha256 != loaded.approval.kernel.sha256
    assert copy.approval.cases == loaded.approval.cases and copy.approval.baseline == loaded.approval.baseline
    assert copy.approval.provenance.note == "3% slower, to rehearse the guard"
    Path(copy.path("kernel.cu")).write_text(loaded.source("kernel.cu"))  # the copy's kernel is held to its digest
    with pytest.raises(Exception, match="matmul-slower: kernel.cu: changed"):
        load_store(store)


def test_a_plan_is_recalibrated_per_case_from_the_slowdown_measured():
    blocks = {"square-2048": 16384, "rect": 11750}
    plan = {16384: 1000, 11750: 400}
    assert variants.recalibrated(plan, blocks, {"square-2048": 0.015, "rect": 0.03}) == {16384: 2000, 11750: 400}
    assert variants.recalibrated(plan, blocks, {"rect": 0.06}) == {16384: 1000, 11750: 200}
