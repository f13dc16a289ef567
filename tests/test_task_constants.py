"""Task-level [constants]: named numbers every expression (and the oracle) sees like a dimension."""

from pathlib import Path

import numpy as np
import pytest

from harness import expr
from harness.oracle import run_oracle
from harness.task import load_task, make_inputs
from harness.task_model import TaskError
from tests.test_task import edited, load_error, valid_task, write_task

POOL_SIGNATURE = ('extern "C" __global__ void pool(const float* x, float* y, int rows, int cols, int window, '
                  'float scale)')


def pooling_task() -> dict:
    """Max pooling over a fixed window: the window is a constant, not a dimension of every case."""
    return {
        "name": "pool", "description": "y[r, j] = scale * max(x[r, j*window : (j+1)*window]).",
        "kernel": {"name": "pool", "signature": POOL_SIGNATURE},
        "constants": {"window": 4, "scale": 0.5},
        "params": [
            {"name": "x", "kind": "input", "dtype": "float32", "shape": ["rows", "cols"]},
            {"name": "y", "kind": "output", "dtype": "float32", "shape": ["rows", "cols // window"]},
            {"name": "rows", "kind": "scalar", "dtype": "int32", "value": "rows"},
            {"name": "cols", "kind": "scalar", "dtype": "int32", "value": "cols"},
            {"name": "window", "kind": "scalar", "dtype": "int32", "value": "window"},
            {"name": "scale", "kind": "scalar", "dtype": "float32", "value": "scale"},
        ],
        "inputs": {"x": {"kind": "uniform", "low": -1.0, "high": 1.0}},
        "tolerance": {"y": {"rtol": 0.0, "atol": 0.0}},
        "launch": {"grid": ["ceil_div(rows * (cols // window), 256)"], "block": [256],
                   "shared_bytes": "4 * 256 * (window > 2)"},
        "cases": [
            {"name": "small", "role": "correctness", "dims": {"rows": 3, "cols": 16}, "seed": 1},
            {"name": "wide", "role": "performance", "dims": {"rows": 64, "cols": 4096}, "seed": 2},
        ],
    }


def write_pool(folder: Path, data: dict | None = None) -> Path:
    write_task(folder, data or pooling_task(), sources=False)
    source = POOL_SIGNATURE + " { }\n"
    (folder / "reference.cu").write_text(source)
    (folder / "initial.cu").write_text(source)
    return folder


def test_a_constant_is_used_like_a_dimension_in_every_expression(tmp_path):
    task = load_task(write_pool(tmp_path / "pool"))
    assert task.constants == {"window": 4, "scale": 0.5}
    wide = task.case("wide")
    assert wide.dims == {"rows": 64, "cols": 4096, "window": 4, "scale": 0.5}
    assert task.shapes(wide.dims) == {"x": (64, 4096), "y": (64, 1024)}
    assert task.scalar_values(wide.dims) == {"rows": 64, "cols": 4096, "window": 4, "scale": 0.5}
    geometry = task.launch.resolve(wide)
    assert geometry.grid == (256, 1, 1) and geometry.shared_bytes == 1024


def test_the_oracle_gets_the_constants_with_the_dims(tmp_path):
    data = dict(pooling_task(), oracle="oracle.py")
    folder = tmp_path / "pool"
    folder.mkdir()
    (folder / "oracle.py").write_text(
        "def oracle(inputs, dims):\n"
        "    x = inputs['x'].reshape(dims['rows'], -1, dims['window'])\n"
        "    return {'y': dims['scale'] * x.max(axis=2)}\n")
    task = load_task(write_pool(folder, data))
    case = task.case("small")
    inputs = make_inputs(task, case.dims, case.seed)
    (y,) = run_oracle(task, case.dims, inputs).values()
    assert y.shape == (3, 4)
    assert np.array_equal(y, 0.5 * inputs["x"].astype(np.float64).reshape(3, 4, 4).max(axis=2))


def test_an_unused_constant_is_allowed(tmp_path):
    data = pooling_task()
    data["constants"]["epsilon"] = 1e-5  # read by the oracle only, say
    assert load_task(write_pool(tmp_path / "pool", data)).constants["epsilon"] == 1e-5


def test_a_case_cannot_set_a_constant(tmp_path):
    data = edited(pooling_task(), {"cases.1.dims.window": 8})
    error = _error(tmp_path, data)
    assert error.field == "cases[1].dims.window"
    assert error.message == "'window' is a task constant ([constants] window = 4); a case cannot set it"


@pytest.mark.parametrize(("constants", "field", "message"), [
    ({"min": 2}, "constants.min", "'min' is a function of expressions; name the constant otherwise"),
    ({"where": 2}, "constants.where", "'where' is a function of expressions"),
    ({"2w": 2}, 'constants."2w"', "'2w' is not a C identifier"),
    ({"w": "4"}, "constants.w", "must be a number, got str '4'"),
    ({"w": True}, "constants.w", "must be a number, got bool True"),
])
def test_bad_constants_are_named(tmp_path, constants, field, message):
    data = valid_task()
    data["constants"] = constants
    error = load_error(tmp_path / "mm", data)
    assert error.field == field
    assert message in error.message


def test_an_unknown_name_lists_the_constants_too(tmp_path):
    data = edited(pooling_task(), {"launch.block": ["tile"]})
    error = _error(tmp_path, data)
    assert error.field == "launch.block[0]"
    assert error.message == ("unknown name 'tile' in 'tile': names must be dimensions defined by the cases or "
                             "constants (dims: rows, cols; constants: window, scale)")


def test_case_dims_stay_integers(tmp_path):
    error = _error(tmp_path, edited(pooling_task(), {"cases.0.dims.rows": 3.0}))
    assert error.field == "cases[0].dims.rows"


def test_comparisons_and_where_in_a_task(tmp_path):
    data = edited(pooling_task(), {"launch.block": ["where(cols <= 16, 32, 256)"]})
    task = load_task(write_pool(tmp_path / "pool", data))
    assert task.launch.resolve(task.case("small")).block == (32, 1, 1)
    assert task.launch.resolve(task.case("wide")).block == (256, 1, 1)
    assert "where" in expr.FUNCTIONS


def _error(tmp_path: Path, data: dict) -> TaskError:
    write_pool(tmp_path / "pool", data)
    with pytest.raises(TaskError) as info:
        load_task(tmp_path / "pool")
    return info.value
