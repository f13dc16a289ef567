"""The judging kernels on the GPU give the host path's digest on the same bytes: every dtype, NaN/Inf, poison,
races, the edge of the tolerance; their sha256-tree is the host's. In this process, on GPU 0 (the kernels are
the referee's own; the two-process path through IPC handles is tests/gpu/test_device_judging.py's)."""

import numpy as np
import pytest

from harness.output_digest import digest_on_host, digest_from_totals
from harness.worker_side import buffers, gpu, utility_kernels
from harness.worker_side.compile_policy import arch_for
from harness.worker_side.device_judging import Judges, pattern
from harness.worker_side.judge_source import JUDGE_KINDS, JUDGE_SOURCE
from harness.worker_side.nvrtc import compile_kernel
from tests.test_judge_kernels import first_mismatches, narrow_edge_cases, variants

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device():
    context = gpu.Context(0)
    arch = arch_for(*context.info.compute_capability)
    compiled = compile_kernel(JUDGE_SOURCE, "referee_judge_float32", arch=arch)
    assert compiled.ok, compiled.log
    utilities_cubin = compile_kernel(utility_kernels.UTILITY_SOURCE, "referee_empty", arch=arch)
    assert utilities_cubin.ok, utilities_cubin.log
    return context, Judges(context, compiled.cubin), utility_kernels.Utilities(context, utilities_cubin.cubin)


def _on_device(array: np.ndarray) -> gpu.Allocation:
    allocation = gpu.Allocation(array.nbytes)
    gpu.upload(allocation.ptr, np.ascontiguousarray(array).view(np.uint8).reshape(-1))
    return allocation


def device_digest(device, dtype: str, expected, first, second, rtol, atol):
    _, judges, _ = device
    allocations = [_on_device(a) for a in (expected, first, second)]
    try:
        e, one, two = (a.ptr for a in allocations)
        itemsize = expected.dtype.itemsize
        patterns = (pattern(buffers.POISON_BYTES[0], itemsize), pattern(buffers.POISON_BYTES[1], itemsize))
        totals = judges.judge(dtype, e, one, two, expected.size, rtol, atol, patterns)
        found = first_mismatches(lambda start: judges.first_after(dtype, e, one, expected.size, rtol, atol, start),
                                 expected, first, totals["mismatches"])
        spread = judges.spread(dtype, e, expected.size)
        return digest_from_totals("out", expected.shape, totals, spread, found, atol)
    finally:
        for allocation in allocations:
            allocation.free()


@pytest.mark.parametrize("dtype", sorted(JUDGE_KINDS))
def test_every_dtype_same_digest_on_the_gpu_as_on_the_host(device, dtype):
    rng = np.random.default_rng(list(JUDGE_KINDS).index(dtype))
    for rtol, atol in ((1e-3, 1e-3), (0.0, 0.0), (1e-2, 0.5)):
        for label, expected, first, second in variants(dtype, rng):
            host = digest_on_host("out", expected, first, second, rtol, atol)
            on_gpu = device_digest(device, dtype, expected, first, second, rtol, atol)
            assert on_gpu.model_dump_json(exclude={"judged_on"}) == host.model_dump_json(exclude={"judged_on"}), label


def test_the_edge_of_the_tolerance_on_the_gpu(device):
    rng = np.random.default_rng(11)
    rtol, atol = 1e-3, 1e-5
    e = rng.standard_normal(1 << 20) * 10
    bound = np.abs(e) * rtol + atol
    g = np.concatenate([e + bound, np.nextafter(e + bound, np.inf), np.nextafter(e + bound, -np.inf), e - bound])
    e = np.concatenate([e] * 4)
    host = digest_on_host("out", e, g, g.copy(), rtol, atol)
    assert device_digest(device, "float64", e, g, g.copy(), rtol, atol).model_dump_json(exclude={"judged_on"}) == \
        host.model_dump_json(exclude={"judged_on"})


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_float32_settling_on_the_gpu_falls_on_the_float64_side_of_the_edge(device, dtype):
    """The device's outward roundings (__fsub_ru, __fadd_rd, __fmul_rd, __double2float_rd) settle no pair the
    float64 rule would judge otherwise: tolerances of a few ulps over the dtype's whole range."""
    for rtol, atol, expected, got in narrow_edge_cases(dtype, np.random.default_rng(9), 1 << 18):
        host = digest_on_host("out", expected, got, got.copy(), rtol, atol)
        assert 0 < host.check.mismatches < expected.size
        on_gpu = device_digest(device, dtype, expected, got, got.copy(), rtol, atol)
        assert on_gpu.model_dump_json(exclude={"judged_on"}) == host.model_dump_json(exclude={"judged_on"}), \
            (rtol, atol)


@pytest.mark.parametrize("nbytes", [1, 1000, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 13, 64 << 20])
def test_the_sha256_tree_on_the_gpu_is_the_hosts(device, nbytes):
    _, judges, _ = device
    data = np.random.default_rng(nbytes).integers(0, 256, size=nbytes, dtype=np.uint8)
    allocation = _on_device(data)
    try:
        assert judges.tree_sha256(allocation.ptr, nbytes) == buffers.tree_sha256(data)
    finally:
        allocation.free()


def test_poison_counts_and_differences_on_the_gpu(device):
    _, judges, utilities = device
    values = np.arange(1 << 16, dtype=np.float32)
    values[[5, 77, 4000]] = np.frombuffer(b"\xff" * 12, dtype=np.float32)
    other = values.copy()
    other[9] += 1
    a, b = _on_device(values), _on_device(other)
    try:
        assert judges.count_equal(utilities, a.ptr, values.size, 4, 0xFF) == 3
        assert judges.differ(utilities, a.ptr, b.ptr, values.nbytes) == 1
    finally:
        a.free()
        b.free()
