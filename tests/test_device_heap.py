"""Kernels that call the device heap are refused unless their task allows it: the task field, the CUBIN's
imported heap routines as NVRTC emits them (no GPU needed), and the refusal as the Referee gives it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from harness.referee import Referee
from harness.results import ReasonCode
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from harness.task_model import TaskError
from harness.worker_side.device_heap import heap_calls, heap_refusal
from harness.worker_side.device_state import imported_symbols
from harness.worker_side.nvrtc import compile_kernel
from tests.test_task import edited, valid_task, write_task

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
SIGNATURE = 'extern "C" __global__ void k(float* o, int i)'


@functools.lru_cache(maxsize=None)
def cubin(body: str, kernel: str = "k", signature: str = SIGNATURE) -> bytes:
    result = compile_kernel(f"{signature} {{ {body} }}", kernel, arch="sm_90")
    assert result.ok, result.log
    return result.cubin


# ---------------------------------------------------------------- the task field

def test_the_heap_is_off_unless_the_task_says_so(tmp_path):
    assert load_task(write_task(tmp_path / "plain", valid_task())).device_heap is False
    assert load_task(MATMUL).device_heap is False
    allowed = load_task(write_task(tmp_path / "heap", edited(valid_task(), {"device_heap": True})))
    assert allowed.device_heap is True


def test_the_field_is_a_strict_boolean(tmp_path):
    with pytest.raises(TaskError, match="device_heap"):
        load_task(write_task(tmp_path, edited(valid_task(), {"device_heap": "yes"})))


# ---------------------------------------------------------------- what a CUBIN imports

@pytest.mark.parametrize("body, calls", [
    ("float* p = (float*)malloc(16); p[0] = i; o[0] = p[0]; free(p);", ("free", "malloc")),
    ("float* p = new float[4]; p[0] = i; o[0] = p[0]; delete[] p;", ("free", "malloc")),
    ("float* p = new float; *p = i; o[0] = *p;", ("malloc",)),
    ("float* p = (float*)__nv_aligned_device_malloc(64, 32); o[0] = p[0];", ("__cuda_syscall_aligned_malloc",)),
], ids=["malloc_free", "new_delete", "new", "aligned_malloc"])
def test_every_way_to_the_heap_is_an_imported_routine(body, calls):
    binary = cubin(body)
    assert heap_calls(binary) == calls
    refusal = heap_refusal(binary, allowed=False)
    assert refusal is not None and all(name in refusal for name in calls) and "device_heap = true" in refusal
    assert heap_refusal(binary, allowed=True) is None


def test_the_heap_has_no_way_in_but_a_direct_call():
    # malloc's address cannot be taken (ptxas refuses it), and device code keeps no module-scope asm to declare
    # it in PTX: every way to the heap is a direct call, which the loader resolves as an import.
    body = "void* (*volatile f)(size_t) = malloc; float* p = (float*)f(16); p[0] = i; o[0] = p[0];"
    result = compile_kernel(f"{SIGNATURE} {{ {body} }}", "k", arch="sm_90")
    assert not result.ok and "Cannot take address of function 'malloc'" in result.log


@pytest.mark.parametrize("body", [
    'printf("%d\\n", i); o[0] = i;',
    "assert(i < 100); o[0] = i;",
    "__shared__ float s[32]; s[threadIdx.x] = i; __syncthreads(); o[0] = s[31 - threadIdx.x];",
], ids=["printf", "assert", "shared"])
def test_kernels_without_the_heap_pass(body):
    binary = cubin(body)
    assert heap_calls(binary) == ()
    assert heap_refusal(binary, allowed=False) is None


def test_printf_and_assert_are_imports_that_are_not_the_heap():
    assert "vprintf" in imported_symbols(cubin('printf("%d\\n", i); o[0] = i;'))
    assert "__assertfail" in imported_symbols(cubin("assert(i < 100); o[0] = i;"))


def test_an_unreadable_cubin_is_left_to_the_worker():
    # The worker refuses to load what it cannot read (harness/worker_side/module_state.py): no heap call is named.
    assert heap_calls(b"\x7fELF" + bytes(60)) == ()
    assert heap_refusal(b"not a cubin", allowed=False) is None


# ---------------------------------------------------------------- the Referee's refusal

class _Unreachable:
    """A worker that must not be called: the refusal comes before any job."""

    resident_inputs = frozenset()

    def call(self, *args, **kwargs):
        raise AssertionError("a job was sent for a kernel that calls the device heap")


class _Pool:
    reference = candidate = _Unreachable()


MATMUL_SIGNATURE = ('extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, '
                    'int m, int n, int k)')
MALLOC_MATMUL = "float* p = (float*)malloc(4); p[0] = a[0]; c[0] = p[0]; free(p);"


@pytest.mark.parametrize("allowed", [False, True])
def test_the_referee_refuses_a_heap_kernel_before_any_job(allowed):
    task = load_task(MATMUL).model_copy(update={"device_heap": allowed})
    binary = cubin(MALLOC_MATMUL, "matmul_f32", MATMUL_SIGNATURE)
    kernel = CompiledKernel("candidate", binary, "matmul_f32", task.launch)
    referee = Referee(task, _Pool(), kernel, TimingSettings())
    cases = list(task.correctness_cases)
    if allowed:  # the heap is the task's to allow: the job goes to the worker
        with pytest.raises(AssertionError, match="a job was sent"):
            referee.check(kernel, cases, against_oracle=True)
        return
    report = referee.check(kernel, cases, against_oracle=True)
    assert not report.passed
    assert [r.code for r in report.reasons] == [ReasonCode.DEVICE_HEAP]  # one reason: no further case is tried
    assert "malloc" in report.reasons[0].detail and report.reasons[0].case == cases[0].name
