"""Fresh inputs on the GPU: the device's draw is the host's (harness/worker_side/fresh_inputs.py), the check mode
counts what changed, and a timing on fresh inputs audits its launches and sees the declared kernel."""

import numpy as np
import pytest

from harness.worker_side import fresh_inputs, gpu, utility_kernels
from harness.worker_side.compile_policy import arch_for
from harness.worker_side.nvrtc import compile_kernel
from harness.referee import Referee
from harness.settings import TimingSettings
from harness.task_model import Case
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu

ELEMENTS = 1 << 20
DRAWS = [("uniform", "float32", dict(low=-1.0, high=1.0)), ("uniform", "float64", dict(low=-2.0, high=3.0)),
         ("uniform", "bfloat16", dict(low=-1.0, high=1.0)), ("uniform", "float16", dict(low=-4.0, high=4.0)),
         ("integers", "int32", dict(low=-1000, high=1000)), ("integers", "int8", dict(low=-128, high=128)),
         ("integers", "uint8", dict(low=0, high=256)), ("integers", "int64", dict(low=-(1 << 40), high=1 << 40)),
         ("normal", "float32", dict(mean=0.5, std=2.0)), ("normal", "bfloat16", dict(mean=1.0, std=0.25))]


@pytest.fixture(scope="module")
def device():
    context = gpu.Context(0)
    compiled = compile_kernel(utility_kernels.UTILITY_SOURCE, "referee_empty",
                              arch=arch_for(*context.info.compute_capability))
    assert compiled.ok, compiled.log
    return context, utility_kernels.Utilities(context, compiled.cubin)


def draw(device, spec: dict, itemsize: int, key: int, stream: int) -> tuple[gpu.Allocation, np.ndarray]:
    context, utilities = device
    buffer = gpu.Allocation(ELEMENTS * itemsize)
    utilities.generate(spec, buffer.ptr, ELEMENTS, key, stream)
    context.synchronize()
    return buffer, gpu.download(buffer.ptr, ELEMENTS * itemsize)


@pytest.mark.parametrize("kind, dtype, params", DRAWS, ids=[f"{k}-{d}" for k, d, _ in DRAWS])
def test_the_device_draws_what_the_host_draws(device, kind, dtype, params):
    spec = fresh_inputs.draw_spec(kind, dtype, **params)
    key, stream = fresh_inputs.launch_key(0x1234_5678_9ABC_DEF0, 17), 1
    host = fresh_inputs.draw_on_host(spec, ELEMENTS, key, stream)
    buffer, got = draw(device, spec, host.itemsize, key, stream)
    buffer.free()
    words = got.view(host.dtype)
    differ = np.flatnonzero(words != host)
    if kind == "normal":  # log and cos may round differently in the last bit: a rare one-ulp step
        assert differ.size <= ELEMENTS // 10_000
        steps = np.abs(words[differ].view(f"<i{host.itemsize}").astype(np.int64)
                       - host[differ].view(f"<i{host.itemsize}").astype(np.int64))
        assert (steps <= 1).all()
    else:
        assert differ.size == 0, f"{differ.size} elements differ, first at {differ[:5]}"


def test_each_launch_and_input_draws_other_values_and_the_check_counts_changes(device):
    context, utilities = device
    spec = fresh_inputs.draw_spec("uniform", "float32", low=-1.0, high=1.0)
    first, a = draw(device, spec, 4, 99, 0)
    second, b = draw(device, spec, 4, 99, 1)
    other_key, c = draw(device, spec, 4, 100, 0)
    a, b, c = (x.view(np.float32) for x in (a, b, c))
    assert (a != b).mean() > 0.999 and (a != c).mean() > 0.999
    counter = gpu.Allocation(8)
    try:
        gpu.fill(counter.ptr, 0, 8, context.stream)
        utilities.generate(spec, first.ptr, ELEMENTS, 99, 0, changed=counter.ptr)
        context.synchronize()
        assert int(gpu.download(counter.ptr, 8).view(np.uint64)[0]) == 0
        gpu.fill(first.ptr + 4 * 1000, 0, 12, context.stream)  # three elements zeroed
        utilities.generate(spec, first.ptr, ELEMENTS, 99, 0, changed=counter.ptr)
        context.synchronize()
        assert int(gpu.download(counter.ptr, 8).view(np.uint64)[0]) == 3
    finally:
        for allocation in (first, second, other_key, counter):
            allocation.free()


def test_a_timing_on_fresh_inputs_audits_its_launches(matmul_task, pool, arch):
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference",
                      launch=matmul_task.own_launch("reference"))
    referee = Referee(matmul_task, pool, reference, TimingSettings(warmups=3, iterations=40))
    case = Case(name="fresh-512", role="performance", dims={"m": 512, "n": 384, "k": 256}, seed=11)
    timing = referee.time(build(matmul_task.source("initial"), matmul_task, arch, launch=matmul_task.own_launch("initial")),
                          [case]).cases[0]
    assert timing.passed, timing.reasons
    assert timing.inputs == "fresh" and timing.audited_launches >= 3
    assert timing.clock == "kernel"  # so the launch records were compared with the declared launch


def test_the_rotated_protocol_is_still_there_for_the_bench(matmul_task, pool, arch):
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference",
                      launch=matmul_task.own_launch("reference"))
    referee = Referee(matmul_task, pool, reference, TimingSettings(warmups=3, iterations=40, fresh_inputs=False))
    case = Case(name="rotated-256", role="performance", dims={"m": 256, "n": 256, "k": 256}, seed=12)
    timing = referee.time(reference, [case]).cases[0]
    assert timing.passed, timing.reasons
    assert timing.inputs == "rotated" and timing.audited_launches == 0
