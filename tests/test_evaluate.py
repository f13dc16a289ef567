"""Pure pieces of the check protocol: unwritten elements and rotation seeds."""

import numpy as np

from harness import jobs
from harness.evaluate import _still_poisoned, input_seed
from harness.task import load_task
from tests.test_cli import MATMUL


def _poisoned(shape, byte, dtype=np.float32):
    return np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, byte, np.uint8).view(dtype).reshape(shape)


def test_elements_holding_both_poisons_are_unwritten_and_nothing_else():
    first, second = _poisoned((3, 4), jobs.POISON_BYTES[0]), _poisoned((3, 4), jobs.POISON_BYTES[1])
    first[:2], second[:2] = 1.5, 1.5  # written in both runs
    second[2, 0] = 7.0                 # written only in the second run: a race, not unwritten
    mask = _still_poisoned(first, second)
    assert mask.sum() == 3 and not mask[:2].any() and not mask[2, 0]


def test_integer_outputs_equal_to_minus_one_are_not_unwritten():
    first = np.full((5,), -1, np.int32)  # 0xFFFFFFFF: the first poison, but a real value
    second = np.full((5,), -1, np.int32)
    assert not _still_poisoned(first, second).any()


def test_rotation_seeds_are_distinct_and_stable():
    case = load_task(MATMUL).cases[1]
    seeds = [input_seed(case, s) for s in range(4)]
    assert seeds[0] == case.seed and len(set(seeds)) == 4
    assert seeds == [input_seed(case, s) for s in range(4)]


def test_a_launch_that_fails_on_an_unseen_case_is_the_candidates_fault():
    from harness.evaluate import Kernel, _geometry
    from harness.task import LaunchSpec

    task = load_task(MATMUL)
    launch = LaunchSpec.model_validate({"grid": ["ceil_div(n, 32) - 3", "ceil_div(m, 32)"], "block": [32, 32]})
    kernel = Kernel("c0", b"", "matmul_f32", launch)
    geometry, failure = _geometry(kernel, task.case("square-2048"))
    assert failure is None and geometry.grid == (61, 64, 1)
    geometry, failure = _geometry(kernel, task.holdout_cases[0])
    assert geometry is None and failure.code.value == "launch_error"
    assert "invalid for this case" in failure.detail and "must be >= 1" in failure.detail
