"""Pure pieces of the check protocol: unwritten elements and rotation seeds."""

import numpy as np

from harness.worker_side import buffers
from harness.judging import still_poisoned
from harness.settings import input_seed
from harness.task import load_task
from tests.test_cli import MATMUL


def _poisoned(shape, byte, dtype=np.float32):
    return np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, byte, np.uint8).view(dtype).reshape(shape)


def test_elements_holding_both_poisons_are_unwritten_and_nothing_else():
    first, second = _poisoned((3, 4), buffers.POISON_BYTES[0]), _poisoned((3, 4), buffers.POISON_BYTES[1])
    first[:2], second[:2] = 1.5, 1.5  # written in both runs
    second[2, 0] = 7.0                 # written only in the second run: a race, not unwritten
    mask = still_poisoned(first, second)
    assert mask.sum() == 3 and not mask[:2].any() and not mask[2, 0]


def test_integer_outputs_equal_to_minus_one_are_not_unwritten():
    first = np.full((5,), -1, np.int32)  # 0xFFFFFFFF: the first poison, but a real value
    second = np.full((5,), -1, np.int32)
    assert not still_poisoned(first, second).any()


def test_rotation_seeds_are_distinct_and_stable():
    case = load_task(MATMUL).cases[1]
    seeds = [input_seed(case, s) for s in range(4)]
    assert seeds[0] == case.seed and len(set(seeds)) == 4
    assert seeds == [input_seed(case, s) for s in range(4)]


def test_a_launch_that_fails_on_an_unseen_case_is_the_candidates_fault():
    from harness.settings import CompiledKernel
    from harness.worker_calls import launch_geometry
    from harness.task_model import LaunchSpec

    task = load_task(MATMUL)
    launch = LaunchSpec.model_validate({"grid": ["ceil_div(n, 32) - 3", "ceil_div(m, 32)"], "block": [32, 32]})
    kernel = CompiledKernel("c0", b"", "matmul_f32", launch)
    geometry, failure = launch_geometry(kernel, task.case("square-2048"))
    assert failure is None and geometry.grid == (61, 64, 1)
    geometry, failure = launch_geometry(kernel, task.holdout_cases[0])
    assert geometry is None and failure.code.value == "launch_error"
    assert "invalid for this case" in failure.detail and "must be >= 1" in failure.detail
