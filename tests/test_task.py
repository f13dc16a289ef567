import copy
import hashlib
import json
import math
import pickle
import re
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tomllib

from harness.task import (
    C_TYPE_SPELLINGS,
    C_TYPES,
    DTYPES,
    Case,
    Generator,
    LaunchGeometry,
    LaunchSpec,
    Param,
    Task,
    TaskError,
    Tolerance,
    load_task,
    make_inputs,
    parse_signature,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
DELETE = object()
SIGNATURE = ('extern "C" __global__ void mm(const float* a, const float* b, float* c, '
             "int m, int n, int k)")
KERNEL_SOURCE = SIGNATURE + " { }\n"


# ------------------------------------------------------------------ helpers

def int_scalar(name: str) -> dict:
    return {"name": name, "kind": "scalar", "dtype": "int32", "value": name}


def valid_task() -> dict:
    """A complete, valid manifest as a dict; tests tweak a copy and write it out."""
    return {
        "name": "mm",
        "description": "Row-major float32 C = A·B.",
        "kernel": {"name": "mm", "signature": SIGNATURE},
        "params": [
            {"name": "a", "kind": "input", "dtype": "float32", "shape": ["m", "k"]},
            {"name": "b", "kind": "input", "dtype": "float32", "shape": ["k", "n"]},
            {"name": "c", "kind": "output", "dtype": "float32", "shape": ["m", "n"]},
            int_scalar("m"), int_scalar("n"), int_scalar("k"),
        ],
        "inputs": {
            "a": {"kind": "uniform", "low": -1.0, "high": 1.0},
            "b": {"kind": "normal", "mean": 0.0, "std": 1.0},
        },
        "tolerance": {"c": {"rtol": 1e-4, "atol": 1e-3}},
        "launch": {"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)", 1], "block": [16, 16, 1],
                   "shared_bytes": 0},
        "cost": {"flops": "2 * m * n * k", "bytes": "4 * (m * k + k * n + m * n)"},
        "cases": [
            {"name": "odd", "role": "correctness", "dims": {"m": 31, "n": 37, "k": 29}, "seed": 1},
            {"name": "square", "role": "performance", "dims": {"m": 256, "n": 256, "k": 256},
             "seed": 2},
            {"name": "tall", "role": "holdout", "dims": {"m": 1000, "n": 8, "k": 64}, "seed": 3},
        ],
    }


def edited(data: dict, edits: dict) -> dict:
    """Apply {"params.0.dtype": value} edits to a deep copy; DELETE removes the key."""
    data = copy.deepcopy(data)
    for path, value in edits.items():
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = data
        for part in parents:
            node = node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return data


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def to_toml(data: dict) -> str:
    """Top-level tables become [sections], lists of tables [[sections]], the rest inline."""
    head, body = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            body += ["", f"[{toml_key(key)}]"]
            body += [f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                body += ["", f"[[{toml_key(key)}]]"]
                body += [f"{toml_key(k)} = {toml_value(v)}" for k, v in item.items()]
        else:
            head.append(f"{toml_key(key)} = {toml_value(value)}")
    return "\n".join(head + body) + "\n"


def write_task(folder: Path, data: dict, sources: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(to_toml(data), encoding="utf-8")
    if sources:
        (folder / "reference.cu").write_text(KERNEL_SOURCE)
        (folder / "initial.cu").write_text(KERNEL_SOURCE)
    return folder


def load_error(folder: Path, data: dict) -> TaskError:
    write_task(folder, data)
    with pytest.raises(TaskError) as info:
        load_task(folder)
    return info.value


def write_npy(folder: Path, name: str, array: np.ndarray) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / name, array)
    return hashlib.sha256((folder / name).read_bytes()).hexdigest()


def test_toml_writer_round_trips():
    data = valid_task()
    assert tomllib.loads(to_toml(data)) == data


# --------------------------------------------------------------- valid task

def test_valid_task_loads(tmp_path):
    task = load_task(write_task(tmp_path, valid_task()))
    assert isinstance(task, Task)
    assert task.root == tmp_path.resolve()
    assert (task.name, task.kernel_name, task.signature) == ("mm", "mm", SIGNATURE)
    assert task.description == "Row-major float32 C = A·B."
    assert (task.reference_file, task.initial_file, task.oracle_file) == (
        "reference.cu", "initial.cu", None)
    assert [p.name for p in task.params] == ["a", "b", "c", "m", "n", "k"]
    assert task.params[0].shape == ("m", "k")
    assert task.inputs["a"] == Generator(kind="uniform", low=-1.0, high=1.0)
    assert task.tolerances == {"c": Tolerance(rtol=1e-4, atol=1e-3)}
    assert task.launch.grid == ("ceil_div(n, 16)", "ceil_div(m, 16)", "1")
    assert task.launch.block == ("16", "16", "1")
    assert task.launch.shared_bytes == "0"
    assert task.reference_launch is None and task.initial_launch is None
    assert [c.name for c in task.cases] == ["odd", "square", "tall"]


def test_load_accepts_the_toml_path_and_a_string(tmp_path):
    write_task(tmp_path, valid_task())
    assert load_task(tmp_path / "task.toml").name == "mm"
    assert load_task(str(tmp_path)).name == "mm"


def test_saxpy_fixture_loads():
    task = load_task(FIXTURES / "saxpy")
    assert task.scalar_values({"n": 10}) == {"alpha": 2.5, "n": 10}
    assert task.launch.resolve(task.case("odd")).grid == (4, 1, 1)
    assert task.inputs["y"].mean == 0.0


def test_task_and_case_names_may_use_dashes_and_dots(tmp_path):
    data = edited(valid_task(), {"name": "mm-f32.v2", "cases.0.name": "odd-31x37x29",
                                 "launch.per_case": {"odd-31x37x29": {"grid": [1], "block": [1]}}})
    task = load_task(write_task(tmp_path, data))
    assert task.case("odd-31x37x29").dims["m"] == 31
    assert task.launch.resolve(task.case("odd-31x37x29")).grid == (1, 1, 1)


def test_optional_sections_and_files(tmp_path):
    data = valid_task()
    data["kernel"].update(reference="ref.cu", initial="start.cu")
    data["oracle"] = "oracle.py"
    data["reference_launch"] = {"grid": [1], "block": [1]}
    data["initial_launch"] = {"grid": ["m"], "block": [1]}
    del data["cost"]
    write_task(tmp_path, data, sources=False)
    for name in ("ref.cu", "start.cu", "oracle.py"):
        (tmp_path / name).write_text(KERNEL_SOURCE)
    task = load_task(tmp_path)
    assert task.source("reference") == KERNEL_SOURCE
    assert task.reference_launch.resolve(task.case("odd")).grid == (1, 1, 1)
    assert task.initial_launch.resolve(task.case("odd")).grid == (31, 1, 1)
    assert task.flops({"m": 1, "n": 1, "k": 1}) is None
    assert task.bytes_moved({"m": 1, "n": 1, "k": 1}) is None
    assert [p.name for p in task.files()] == ["oracle.py", "ref.cu", "start.cu", "task.toml"]


# ---------------------------------------------------------- file-level errors

def test_missing_task_toml(tmp_path):
    with pytest.raises(TaskError) as info:
        load_task(tmp_path)
    assert info.value.file == tmp_path.resolve() / "task.toml"
    assert info.value.field == "(file)"
    assert "not found" in info.value.message


def test_invalid_toml_reports_the_line(tmp_path):
    (tmp_path / "task.toml").write_text('name = "mm"\ndescription "x"\n')
    with pytest.raises(TaskError) as info:
        load_task(tmp_path)
    assert info.value.field == "(file)"
    assert "invalid TOML" in info.value.message and "line 2" in info.value.message


def test_non_utf8_manifest(tmp_path):
    (tmp_path / "task.toml").write_bytes(b'name = "\xff"\n')
    with pytest.raises(TaskError, match="not valid UTF-8"):
        load_task(tmp_path)


def test_task_error_format_and_pickling(tmp_path):
    err = TaskError(tmp_path / "task.toml", "params[2].shape[0]", "bad")
    assert str(err) == f"{tmp_path / 'task.toml'}: params[2].shape[0]: bad"
    assert (err.file, err.field, err.message) == (tmp_path / "task.toml", "params[2].shape[0]", "bad")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.field == err.field


def test_missing_reference_file(tmp_path):
    write_task(tmp_path, valid_task(), sources=False)
    (tmp_path / "initial.cu").write_text(KERNEL_SOURCE)
    with pytest.raises(TaskError) as info:
        load_task(tmp_path)
    assert info.value.field == "kernel.reference"
    assert "'reference.cu' does not exist" in info.value.message


# ------------------------------------------------------- manifest error table

def sig(params: str, head: str = 'extern "C" __global__ void mm') -> dict:
    return {"kernel.signature": f"{head}({params})"}


SIG_TAIL = "const float* b, float* c, int m, int n, int k"
INT8_A = {"params.0.dtype": "int8"}
NPY_SHA = "0" * 64

ERRORS = [
    # structure: missing, unknown and mistyped keys
    ("missing_name", {"name": DELETE}, "name", "missing required key"),
    ("missing_description", {"description": DELETE}, "description", "missing required key"),
    ("missing_kernel", {"kernel": DELETE}, "kernel", "missing required key"),
    ("missing_signature", {"kernel.signature": DELETE}, "kernel.signature", "missing required key"),
    ("missing_params", {"params": DELETE}, "params", "missing required key"),
    ("missing_param_kind", {"params.1.kind": DELETE}, "params[1].kind", "missing required key"),
    ("missing_param_dtype", {"params.2.dtype": DELETE}, "params[2].dtype", "missing required key"),
    ("missing_launch", {"launch": DELETE}, "launch", "missing required key"),
    ("missing_block", {"launch.block": DELETE}, "launch.block", "missing required key"),
    ("missing_cases", {"cases": DELETE}, "cases", "missing required key"),
    ("missing_case_seed", {"cases.2.seed": DELETE}, "cases[2].seed", "missing required key"),
    ("missing_case_role", {"cases.0.role": DELETE}, "cases[0].role", "missing required key"),
    ("missing_atol", {"tolerance.c.atol": DELETE}, "tolerance.c.atol", "missing required key"),
    ("missing_generator_kind", {"inputs.a.kind": DELETE}, "inputs.a.kind", "missing required key"),
    ("unknown_top_key", {"colour": "red"}, "colour", "unknown key"),
    ("unknown_kernel_key", {"kernel.entry": "x"}, "kernel.entry", "unknown key"),
    ("unknown_param_key", {"params.0.shap": ["m"]}, "params[0].shap",
     "unknown key (allowed here: name, kind, dtype, shape, value); did you mean 'shape'?"),
    ("unknown_generator_key", {"inputs.a.lo": 0.0}, "inputs.a.lo",
     "unknown key (allowed here: kind, low, high, mean, std, file, sha256); did you mean 'low'?"),
    ("unknown_per_case_key", {"launch.per_case": {"odd": {"grid": [1], "block": [1], "smem": 0}}},
     "launch.per_case.odd.smem", "allowed here: grid, block, shared_bytes, per_case"),
    ("unknown_case_key", {"cases.1.weight": 2}, "cases[1].weight",
     "unknown key (allowed here: name, role, dims, seed)"),
    ("unknown_launch_key", {"launch.threads": 3}, "launch.threads", "unknown key"),
    ("unknown_cost_key", {"cost.energy": "1"}, "cost.energy", "unknown key"),
    ("unknown_tolerance_key", {"tolerance.c.ulp": 1}, "tolerance.c.ulp", "unknown key"),
    ("name_not_string", {"name": 5}, "name", "valid string (got int 5)"),
    ("kernel_not_table", {"kernel": "mm"}, "kernel", "must be a table (got str 'mm')"),
    ("params_not_array", {"params": "a"}, "params", "must be an array"),
    ("shape_not_array", {"params.0.shape": "m"}, "params[0].shape", "must be an array"),
    ("shape_entry_bool", {"params.0.shape": [True, "k"]}, "params[0].shape[0]", "valid string"),
    ("seed_string", {"cases.0.seed": "1"}, "cases[0].seed", "valid integer"),
    ("seed_float", {"cases.0.seed": 1.0}, "cases[0].seed", "valid integer"),
    ("seed_bool", {"cases.0.seed": True}, "cases[0].seed", "valid integer"),
    ("seed_negative", {"cases.0.seed": -1}, "cases[0].seed", "greater than or equal to 0"),
    ("dim_float", {"cases.0.dims.m": 3.5}, "cases[0].dims.m", "valid integer"),
    ("role_unknown", {"cases.1.role": "timing"}, "cases[1].role",
     "'correctness', 'performance' or 'holdout'"),
    ("param_kind_unknown", {"params.0.kind": "inout"}, "params[0].kind",
     "'input', 'output' or 'scalar'"),
    ("generator_kind_unknown", {"inputs.a.kind": "gaussian"}, "inputs.a.kind",
     "'uniform', 'normal', 'integers' or 'npy'"),
    ("generator_low_string", {"inputs.a.low": "-1"}, "inputs.a.low", "must be a number"),
    ("generator_low_bool", {"inputs.a.low": False}, "inputs.a.low", "must be a number"),
    ("generator_low_inf", {"inputs.a.low": -math.inf}, "inputs.a.low", "must be finite"),
    ("rtol_negative", {"tolerance.c.rtol": -1e-3}, "tolerance.c.rtol", "greater than or equal to 0"),
    ("atol_nan", {"tolerance.c.atol": math.nan}, "tolerance.c.atol", "finite number"),
    ("rtol_string", {"tolerance.c.rtol": "small"}, "tolerance.c.rtol", "valid number"),
    ("grid_four_entries", {"launch.grid": [1, 1, 1, 1]}, "launch.grid", "1 to 3 entries"),
    ("grid_no_entries", {"launch.grid": []}, "launch.grid", "got 0"),
    ("cost_flops_bool", {"cost.flops": True}, "cost.flops", "valid string"),
    ("nested_per_case", {"launch.per_case": {"odd": {"grid": [1], "block": [1], "per_case": {
        "square": {"grid": [1], "block": [1]}}}}}, "launch.per_case", "overrides do not nest"),
    # names
    ("task_name_with_space", {"name": "mat mul"}, "name", "'mat mul' is not a valid name"),
    ("task_name_with_slash", {"name": "a/b"}, "name", "'a/b' is not a valid name"),
    ("task_name_too_long", {"name": "x" * 65}, "name", "is not a valid name (1 to 64"),
    ("kernel_name_not_identifier", {"kernel.name": "2mm"}, "kernel.name", "not a C identifier"),
    ("param_name_not_identifier", {"params.0.name": "a-b"}, "params[0].name", "not a C identifier"),
    ("param_name_duplicate", {"params.1.name": "a"}, "params[1].name", "duplicate name 'a'"),
    ("case_name_with_space", {"cases.0.name": "odd one"}, "cases[0].name", "is not a valid name"),
    ("case_name_leading_dash", {"cases.0.name": "-odd"}, "cases[0].name", "is not a valid name"),
    ("case_name_duplicate", {"cases.2.name": "odd"}, "cases[2].name", "duplicate name 'odd'"),
    ("dim_name_not_identifier", {"cases.0.dims": {"m": 31, "n": 37, "k": 29, "k-1": 3}},
     'cases[0].dims."k-1"', "not a C identifier"),
    # params
    ("dtype_unknown", {"params.0.dtype": "float8"}, "params[0].dtype",
     "unknown dtype 'float8' (allowed: float32, float16, bfloat16, float64, int8"),
    ("array_without_shape", {"params.0.shape": DELETE}, "params[0].shape", "at least one shape"),
    ("array_empty_shape", {"params.2.shape": []}, "params[2].shape", "at least one shape"),
    ("array_with_value", {"params.2.value": "m"}, "params[2].value", "give it a shape, not a value"),
    ("scalar_with_shape", {"params.3.shape": ["m"]}, "params[3].shape", "takes a value, not a shape"),
    ("scalar_without_value", {"params.3.value": DELETE}, "params[3].value", "needs a value"),
    ("no_output", {"params.2.kind": "input"}, "params", 'no parameter has kind = "output"'),
    # which params take generators and tolerances
    ("input_without_generator", {"inputs.b": DELETE}, "inputs",
     "input 'b' has no generator; add [inputs.b]"),
    ("no_inputs_table", {"inputs": DELETE}, "inputs", "input 'a' has no generator"),
    ("generator_for_output", {"inputs.c": {"kind": "normal", "std": 1.0}}, "inputs.c",
     "'c' is output, not input; only inputs take generator"),
    ("generator_for_scalar", {"inputs.m": {"kind": "normal", "std": 1.0}}, "inputs.m",
     "'m' is scalar, not input"),
    ("generator_for_unknown", {"inputs.z": {"kind": "normal", "std": 1.0}}, "inputs.z",
     "there is no parameter named 'z'"),
    ("output_without_tolerance", {"tolerance.c": DELETE}, "tolerance",
     "output 'c' has no tolerance; add [tolerance.c]"),
    ("tolerance_for_input", {"tolerance.a": {"rtol": 0, "atol": 0}}, "tolerance.a",
     "'a' is input, not output"),
    ("tolerance_for_unknown", {"tolerance.z": {"rtol": 0, "atol": 0}}, "tolerance.z",
     "there is no parameter named 'z'"),
    # generator fields
    ("uniform_low_equals_high", {"inputs.a.high": -1.0}, "inputs.a.high",
     "high (-1.0) must be greater than low (-1.0)"),
    ("uniform_low_above_high", {"inputs.a.low": 2.0}, "inputs.a.high", "greater than low (2.0)"),
    ("uniform_missing_low", {"inputs.a.low": DELETE}, "inputs.a.low", 'kind = "uniform" needs low'),
    ("uniform_missing_high", {"inputs.a.high": DELETE}, "inputs.a.high", "needs high"),
    ("uniform_with_std", {"inputs.a.std": 1.0}, "inputs.a.std",
     'std does not apply to kind = "uniform" (it takes: low, high)'),
    ("uniform_with_file", {"inputs.a.file": "a.npy"}, "inputs.a.file", "does not apply"),
    ("uniform_on_integer_dtype", INT8_A, "inputs.a.kind",
     'kind = "uniform" needs a float dtype (use kind = "integers"), but \'a\' is int8'),
    ("uniform_outside_float16", {"params.0.dtype": "float16", "inputs.a.high": 1e5},
     "inputs.a.high", "100000.0 is outside the float16 range"),
    ("normal_std_zero", {"inputs.b.std": 0.0}, "inputs.b.std", "std must be > 0, got 0.0"),
    ("normal_std_negative", {"inputs.b.std": -1}, "inputs.b.std", "std must be > 0, got -1"),
    ("normal_missing_std", {"inputs.b.std": DELETE}, "inputs.b.std", 'kind = "normal" needs std'),
    ("normal_with_low", {"inputs.b.low": 0.0}, "inputs.b.low",
     'low does not apply to kind = "normal" (it takes: mean, std)'),
    ("normal_on_integer_dtype", {"params.1.dtype": "uint32"}, "inputs.b.kind",
     "but 'b' is uint32"),
    ("integers_on_float_dtype", {"inputs.a": {"kind": "integers", "low": 0, "high": 4}},
     "inputs.a.kind", 'kind = "integers" needs an integer dtype, but \'a\' is float32'),
    ("integers_float_bound", {**INT8_A, "inputs.a": {"kind": "integers", "low": 0.5, "high": 4}},
     "inputs.a.low", 'kind = "integers" needs an integer low, got 0.5'),
    ("integers_empty_range", {**INT8_A, "inputs.a": {"kind": "integers", "low": 4, "high": 4}},
     "inputs.a.high", "high (4, exclusive) must be greater than low (4)"),
    ("integers_below_dtype", {**INT8_A, "inputs.a": {"kind": "integers", "low": -129, "high": 0}},
     "inputs.a.low", "-129 is below the int8 minimum -128"),
    ("integers_above_dtype", {**INT8_A, "inputs.a": {"kind": "integers", "low": 0, "high": 129}},
     "inputs.a.high", "high - 1 = 128 is above the int8 maximum 127"),
    ("integers_negative_unsigned",
     {"params.0.dtype": "uint8", "inputs.a": {"kind": "integers", "low": -1, "high": 3}},
     "inputs.a.low", "-1 is below the uint8 minimum 0"),
    ("integers_with_mean",
     {**INT8_A, "inputs.a": {"kind": "integers", "low": 0, "high": 3, "mean": 1.0}},
     "inputs.a.mean", 'mean does not apply to kind = "integers"'),
    ("integers_missing_high", {**INT8_A, "inputs.a": {"kind": "integers", "low": 0}},
     "inputs.a.high", 'kind = "integers" needs high'),
    ("npy_missing_sha256", {"inputs.a": {"kind": "npy", "file": "a.npy"}}, "inputs.a.sha256",
     'kind = "npy" needs sha256'),
    ("npy_missing_file", {"inputs.a": {"kind": "npy", "sha256": NPY_SHA}}, "inputs.a.file",
     'kind = "npy" needs file'),
    ("npy_with_low", {"inputs.a": {"kind": "npy", "file": "a.npy", "sha256": NPY_SHA, "low": 0}},
     "inputs.a.low", 'low does not apply to kind = "npy" (it takes: file, sha256)'),
    ("npy_bad_sha256", {"inputs.a": {"kind": "npy", "file": "a.npy", "sha256": "abc123"}},
     "inputs.a.sha256", "must be 64 hexadecimal digits"),
    ("npy_absolute_path", {"inputs.a": {"kind": "npy", "file": "/etc/hostname", "sha256": NPY_SHA}},
     "inputs.a.file", "must be a path relative to the task folder"),
    ("npy_escapes", {"inputs.a": {"kind": "npy", "file": "../a.npy", "sha256": NPY_SHA}},
     "inputs.a.file", "'../a.npy' escapes the task folder"),
    ("npy_absent", {"inputs.a": {"kind": "npy", "file": "a.npy", "sha256": NPY_SHA}},
     "inputs.a.file", "'a.npy' does not exist"),
    # expressions
    ("shape_syntax_error", {"params.0.shape": ["m +", "k"]}, "params[0].shape[0]", "invalid syntax"),
    ("shape_unknown_function", {"params.0.shape": ["m", "foo(k)"]}, "params[0].shape[1]",
     "unknown function 'foo' (allowed: ceil_div, min, max)"),
    ("shape_unknown_name", {"params.1.shape": ["k", "q"]}, "params[1].shape[1]",
     "unknown name 'q' in 'q': names must be dimensions defined by the cases (dims: m, n, k)"),
    ("shape_attribute", {"params.0.shape": ["m.real", "k"]}, "params[0].shape[0]",
     "attribute access is not allowed"),
    ("value_import", {"params.3.value": "__import__('os')"}, "params[3].value",
     "unknown function '__import__'"),
    ("grid_syntax_error", {"launch.grid": ["n / / 16"]}, "launch.grid[0]", "invalid syntax"),
    ("block_unknown_name", {"launch.block": ["tile", 16]}, "launch.block[0]", "unknown name 'tile'"),
    ("shared_bytes_lambda", {"launch.shared_bytes": "lambda: 0"}, "launch.shared_bytes", "lambda"),
    ("cost_unknown_name", {"cost.flops": "2 * m * n * k * x"}, "cost.flops", "unknown name 'x'"),
    ("cost_subscript", {"cost.bytes": "m[0]"}, "cost.bytes", "subscript is not allowed"),
    ("reference_launch_comparison", {"reference_launch": {"grid": ["m <= 1"], "block": [1]}},
     "reference_launch.grid[0]", "comparison is not allowed"),
    ("initial_launch_huge_power", {"initial_launch": {"grid": ["m ** 99"], "block": [1]}},
     "initial_launch.grid[0]", "exponent '99'"),
    ("per_case_bad_expression", {"launch.per_case": {"odd": {"grid": [1], "block": ["min(m)"]}}},
     "launch.per_case.odd.block[0]", "min() takes at least 2 arguments"),
    # cases and the values their dims give
    ("case_missing_dim", {"cases.1.dims": {"m": 256, "n": 256}}, "cases[1].dims",
     "case 'square' does not define dimension 'k' (used by params[0].shape[1])"),
    ("case_extra_dim", {"cases.0.dims.z": 4}, "cases[0].dims.z",
     "unknown dimension 'z': no expression uses it"),
    ("no_performance_case", {"cases.1.role": "correctness"}, "cases",
     'no case has role = "performance"; at least one is needed'),
    ("no_cases", {"cases": []}, "cases", 'no case has role = "performance"'),
    ("per_case_unknown_case", {"launch.per_case": {"nope": {"grid": [1], "block": [1]}}},
     "launch.per_case.nope", "there is no case named 'nope' (cases: odd, square, tall)"),
    ("shape_zero", {"cases.0.dims.m": 0}, "params[0].shape[0]",
     "'m' is 0 for case 'odd'; shapes must be >= 1"),
    ("shape_negative", {"cases.2.dims.n": -3}, "params[1].shape[1]", "'n' is -3 for case 'tall'"),
    ("shape_fractional", {"params.0.shape": ["m / 2", "k"]}, "params[0].shape[0]",
     "15.5, which is not an integer (case 'odd')"),
    ("shape_division_by_zero", {"params.0.shape": ["m // (k - 29)", "k"]}, "params[0].shape[0]",
     "division by zero"),
    ("scalar_overflows_int32", {"cases.1.dims.k": 2**31}, "params[5].value",
     "is 2147483648, outside int32"),
    ("scalar_outside_float16", {"params.5.dtype": "float16", "params.5.value": "k * 10000"},
     "params[5].value", "'k * 10000' is 290000, outside the float16 range"),
    ("scalar_fraction_for_int", {"params.3.value": "m / 2"}, "params[3].value", "not an integer"),
    ("grid_zero", {"launch.grid": [0]}, "launch.grid[0]", "'0' is 0 for case 'odd'; must be >= 1"),
    ("grid_expression_zero", {"launch.grid": ["n // 64"]}, "launch.grid[0]",
     "'n // 64' is 0 for case 'odd'"),
    ("block_zero", {"launch.block": [16, 0]}, "launch.block[1]", "must be >= 1"),
    ("block_fractional", {"launch.block": [16.5]}, "launch.block[0]", "not an integer"),
    ("block_too_many_threads", {"launch.block": [64, 32]}, "launch.block",
     "2048 threads per block exceeds the CUDA limit of 1024 (case 'odd')"),
    ("block_z_too_big", {"launch.block": [1, 1, 65]}, "launch.block[2]", "65 exceeds the CUDA limit of 64"),
    ("grid_y_too_big", {"launch.grid": [1, 65536]}, "launch.grid[1]", "65536 exceeds the CUDA limit of 65535"),
    ("shared_bytes_negative", {"launch.shared_bytes": -1}, "launch.shared_bytes", "must be >= 0"),
    ("reference_launch_zero", {"reference_launch": {"grid": [1], "block": ["m - 31"]}},
     "reference_launch.block[0]", "'m - 31' is 0 for case 'odd'"),
    ("per_case_override_zero", {"launch.per_case": {"square": {"grid": [0], "block": [1]}}},
     "launch.per_case.square.grid[0]", "for case 'square'"),
    ("cost_negative", {"cost.flops": "m - n"}, "cost.flops", "is -6 for case 'odd'; must be >= 0"),
    ("cost_division_by_zero", {"cost.bytes": "m / (k - 29)"}, "cost.bytes", "division by zero"),
    # the kernel signature
    ("sig_no_extern_c", sig("const float* a, " + SIG_TAIL, "__global__ void mm"),
     "kernel.signature", 'must start with extern "C"'),
    ("sig_extern_cpp", sig("const float* a, " + SIG_TAIL, 'extern "C++" __global__ void mm'),
     "kernel.signature", 'must start with extern "C"'),
    ("sig_no_global", sig("const float* a, " + SIG_TAIL, 'extern "C" void mm'),
     "kernel.signature", "expected __global__"),
    ("sig_device", sig("const float* a, " + SIG_TAIL, 'extern "C" __device__ void mm'),
     "kernel.signature", "expected __global__"),
    ("sig_returns_int", sig("const float* a, " + SIG_TAIL, 'extern "C" __global__ int mm'),
     "kernel.signature", "must return void"),
    ("sig_no_parameter_list", {"kernel.signature": 'extern "C" __global__ void mm'},
     "kernel.signature", 'expected extern "C" __global__ void NAME'),
    ("sig_wrong_name", sig("const float* a, " + SIG_TAIL, 'extern "C" __global__ void matmul'),
     "kernel.signature", "declares kernel 'matmul' but kernel.name is 'mm'"),
    ("sig_too_few", sig("const float* a, const float* b, float* c, int m, int n"),
     "kernel.signature", "has 5 parameters but params lists 6 (a, b, c, m, n, k)"),
    ("sig_order", sig("const float* b, const float* a, float* c, int m, int n, int k"),
     "kernel.signature", "parameter 1 is 'b' but params[0] is 'a'; names and order must match"),
    ("sig_scalar_pointer", sig("const float* a, const float* b, float* c, int* m, int n, int k"),
     "kernel.signature", "'m' is a pointer but params[3] is scalar"),
    ("sig_array_by_value", sig("const float a, " + SIG_TAIL), "kernel.signature",
     "'a' is not a pointer but params[0] is input"),
    ("sig_wrong_ctype", sig("const double* a, " + SIG_TAIL), "kernel.signature",
     "'a' is declared 'double', which is float64; params[0] is float32, which needs 'float'"),
    ("sig_size_t", sig("const float* a, const float* b, float* c, size_t m, int n, int k"),
     "kernel.signature", "'m' is declared 'size_t', which is not a supported C type; "
     "params[3] is int32, which needs 'int' (or int32_t, signed, signed int)"),
    ("sig_unsigned_for_int32",
     sig("const float* a, const float* b, float* c, unsigned int m, int n, int k"),
     "kernel.signature", "'m' is declared 'unsigned int', which is uint32"),
    ("sig_const_output", sig("const float* a, const float* b, const float* c, int m, int n, int k"),
     "kernel.signature", "output 'c' is declared const; the kernel must write it"),
    ("sig_mutable_input", sig("float* a, " + SIG_TAIL), "kernel.signature",
     "input 'a' must be declared const (const float* a)"),
    ("sig_const_pointer_not_pointee", sig("float* const a, " + SIG_TAIL), "kernel.signature",
     "input 'a' must be declared const"),
    ("sig_pointer_to_pointer", sig("const float** a, " + SIG_TAIL), "kernel.signature",
     "pointers to pointers are not supported"),
    ("sig_default_value", sig("const float* a, const float* b, float* c, int m, int n, int k = 3"),
     "kernel.signature", "parameter 6 ('int k = 3') needs a type and a name"),
    ("sig_type_without_name", sig("const float*, " + SIG_TAIL), "kernel.signature",
     "parameter 1 ('const float*') needs a type and a name"),
    ("sig_name_without_type", sig("a, " + SIG_TAIL), "kernel.signature", "'a' has no type"),
    ("sig_function_pointer", sig("void (*f)(int)"), "kernel.signature",
     "cannot contain parentheses"),
    # files named by the manifest
    ("reference_absent", {"kernel.reference": "ref.cu"}, "kernel.reference",
     "'ref.cu' does not exist"),
    ("initial_absent", {"kernel.initial": "start.cu"}, "kernel.initial", "'start.cu' does not exist"),
    ("reference_escapes", {"kernel.reference": "../reference.cu"}, "kernel.reference",
     "escapes the task folder"),
    ("oracle_absent", {"oracle": "oracle.py"}, "oracle", "'oracle.py' does not exist"),
    ("oracle_absolute", {"oracle": "/etc/hostname"}, "oracle", "must be a path relative"),
]


@pytest.mark.parametrize(("edits", "field", "message"), [e[1:] for e in ERRORS],
                         ids=[e[0] for e in ERRORS])
def test_manifest_error(tmp_path, edits, field, message):
    folder = tmp_path / "task"
    err = load_error(folder, edited(valid_task(), edits))
    assert err.file == folder.resolve() / "task.toml"
    assert err.field == field, err.message
    assert message in err.message
    assert str(err) == f"{err.file}: {field}: {err.message}"


def test_error_ids_are_unique():
    assert len({e[0] for e in ERRORS}) == len(ERRORS)


# ----------------------------------------------------------------- signatures

@pytest.mark.parametrize("signature", [
    'extern "C" __global__ void mm(const float* __restrict__ a, const float* __restrict__ b, '
    "float* __restrict__ c, int m, int n, int k)",
    'extern  "C"\n__global__   void\tmm (\n  const float *a,\n  const float *b,\n  float *c,\n'
    "  int m, int n, int k\n);",
    'extern "C" __global__ void mm(float const* a, float const * b, float* const c, '
    "const int m, int32_t n, signed int k)",
    'extern "C" __global__ void mm(const float*__restrict a, const float* b, float* c, '
    "signed m, int n, int k)",
])
def test_signature_spellings_accepted(tmp_path, signature):
    task = load_task(write_task(tmp_path, edited(valid_task(), {"kernel.signature": signature})))
    assert task.signature == signature


def test_parse_signature_details():
    parsed = parse_signature(
        'extern "C" __global__ void k(const __half* __restrict__ x, unsigned long long* y, int n)')
    assert parsed.name == "k"
    assert [(p.name, p.ctype, p.pointer, p.const) for p in parsed.params] == [
        ("x", "__half", True, True), ("y", "unsigned long long", True, False),
        ("n", "int", False, False)]
    assert parse_signature('extern "C" __global__ void k(void)').params == ()
    assert parse_signature('extern "C" __global__ void k()').params == ()


def integer_aware_task(dtype: str, spelling: str) -> dict:
    """The valid task with input 'a' switched to ``dtype`` spelled as ``spelling``."""
    generator = ({"kind": "integers", "low": 0, "high": 100} if DTYPES[dtype].kind in "iu"
                 else {"kind": "uniform", "low": -1.0, "high": 1.0})
    return edited(valid_task(), {
        "params.0.dtype": dtype, "inputs.a": generator,
        "kernel.signature": SIGNATURE.replace("const float* a", f"const {spelling}* a"),
    })


@pytest.mark.parametrize(("dtype", "spelling"), sorted(
    (d, s) for d, spellings in C_TYPE_SPELLINGS.items() for s in spellings))
def test_every_c_spelling_matches_its_dtype(tmp_path, dtype, spelling):
    task = load_task(write_task(tmp_path, integer_aware_task(dtype, spelling)))
    arrays = make_inputs(task, {"m": 3, "n": 4, "k": 5}, seed=0)
    assert arrays["a"].dtype == DTYPES[dtype] and arrays["a"].shape == (3, 5)


def test_type_tables_agree():
    assert set(DTYPES) == set(C_TYPES) == set(C_TYPE_SPELLINGS)
    assert DTYPES["bfloat16"] == np.dtype(ml_dtypes.bfloat16)
    for dtype, ctype in C_TYPES.items():
        assert ctype in C_TYPE_SPELLINGS[dtype]
    assert not any("size_t" in s for s in C_TYPE_SPELLINGS.values())
    assert "long" in C_TYPE_SPELLINGS["int64"] and "int64_t" in C_TYPE_SPELLINGS["int64"]
    assert "half" in C_TYPE_SPELLINGS["float16"]


# ------------------------------------------------------------------ Task API

@pytest.fixture
def task(tmp_path) -> Task:
    return load_task(write_task(tmp_path, valid_task()))


def test_case_lookup(task):
    assert task.case("square").dims == {"m": 256, "n": 256, "k": 256}
    with pytest.raises(KeyError, match=r"no case 'nope' \(cases: odd, square, tall\)"):
        task.case("nope")


def test_case_groups_keep_file_order(task):
    assert [c.name for c in task.visible_cases] == ["odd", "square"]
    assert [c.name for c in task.correctness_cases] == ["odd"]
    assert [c.name for c in task.performance_cases] == ["square"]
    assert [c.name for c in task.holdout_cases] == ["tall"]


def test_param_groups(task):
    assert [p.name for p in task.input_params] == ["a", "b"]
    assert [p.name for p in task.output_params] == ["c"]
    assert [p.name for p in task.scalar_params] == ["m", "n", "k"]
    assert [p.name for p in task.array_params] == ["a", "b", "c"]


def test_shapes_scalars_bytes_and_cost(task):
    dims = task.case("odd").dims
    assert task.shapes(dims) == {"a": (31, 29), "b": (29, 37), "c": (31, 37)}
    values = task.scalar_values(dims)
    assert values == {"m": 31, "n": 37, "k": 29}
    assert all(type(v) is int for v in values.values())
    assert task.nbytes(dims) == {"a": 31 * 29 * 4, "b": 29 * 37 * 4, "c": 31 * 37 * 4}
    assert task.flops(dims) == 2.0 * 31 * 37 * 29
    assert task.bytes_moved(dims) == 4.0 * (31 * 29 + 29 * 37 + 31 * 37)
    assert isinstance(task.flops(dims), float)


def test_float_scalars_are_floats(tmp_path):
    data = valid_task()
    data["params"].append({"name": "alpha", "kind": "scalar", "dtype": "float32", "value": 2})
    data["kernel"]["signature"] = SIGNATURE.replace("int k)", "int k, float alpha)")
    task = load_task(write_task(tmp_path, data))
    value = task.scalar_values({"m": 1, "n": 1, "k": 1})["alpha"]
    assert value == 2.0 and type(value) is float


def test_source_and_files(task):
    assert task.source("reference") == KERNEL_SOURCE
    assert task.source("initial") == KERNEL_SOURCE
    with pytest.raises(ValueError, match="'reference' or 'initial'"):
        task.source("oracle")  # type: ignore[arg-type]
    assert task.files() == [task.root / n for n in ("initial.cu", "reference.cu", "task.toml")]


def test_task_is_frozen(task):
    with pytest.raises(Exception, match="frozen"):
        task.name = "other"  # type: ignore[misc]
    with pytest.raises(Exception, match="frozen"):
        task.params[0].dtype = "float64"  # type: ignore[misc]


def test_launch_resolves_per_case(tmp_path):
    data = valid_task()
    data["launch"]["per_case"] = {"square": {"grid": [8, 8], "block": [256], "shared_bytes": "k * 4"}}
    task = load_task(write_task(tmp_path, data))
    assert task.launch.resolve(task.case("odd")) == LaunchGeometry(
        grid=(3, 2, 1), block=(16, 16, 1), shared_bytes=0)
    assert task.launch.resolve(task.case("square")) == LaunchGeometry(
        grid=(8, 8, 1), block=(256, 1, 1), shared_bytes=1024)


def test_launch_spec_accepts_short_and_numeric_entries():
    spec = LaunchSpec(grid=4, block=["m", 2])
    assert spec.grid == ("4", "1", "1") and spec.block == ("m", "2", "1")
    assert spec.shared_bytes == "0" and spec.per_case == {}
    case = Case(name="x", role="performance", dims={"m": 3}, seed=0)
    assert spec.resolve(case) == LaunchGeometry(grid=(4, 1, 1), block=(3, 2, 1), shared_bytes=0)


def test_launch_resolve_errors_are_value_errors():
    case = Case(name="x", role="performance", dims={"m": 0}, seed=0)
    with pytest.raises(ValueError, match=r"block\[0\]: 'm' is 0 for case 'x'; must be >= 1"):
        LaunchSpec(grid=[1], block=["m"]).resolve(case)
    with pytest.raises(ValueError, match="unknown name 'q'"):
        LaunchSpec(grid=["q"], block=[1]).resolve(case)
    with pytest.raises(ValueError, match=r"shared_bytes: '-4' is -4"):
        LaunchSpec(grid=[1], block=[1], shared_bytes=-4).resolve(case)


def test_models_forbid_unknown_fields():
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        Param(name="a", kind="input", dtype="float32", shape=["n"], colour="red")
    assert Param(name="a", kind="input", dtype="float32", shape=["n", 4]).shape == ("n", "4")
    assert Generator(kind="normal", std=2.0).mean == 0.0


# -------------------------------------------------------------- make_inputs

def test_make_inputs_follows_the_documented_streams(task):
    dims = task.case("odd").dims
    arrays = make_inputs(task, dims, seed=7)
    assert set(arrays) == {"a", "b"}

    def rng(name):
        entropy = np.random.SeedSequence([7, zlib.crc32(name.encode())])
        return np.random.Generator(np.random.PCG64(entropy))

    np.testing.assert_array_equal(arrays["a"], rng("a").uniform(-1.0, 1.0, (31, 29)).astype(np.float32))
    np.testing.assert_array_equal(arrays["b"], rng("b").normal(0.0, 1.0, (29, 37)).astype(np.float32))


def test_make_inputs_is_deterministic_and_seed_sensitive(task):
    dims = task.case("odd").dims
    first, again, other = (make_inputs(task, dims, s) for s in (1, 1, 2))
    for name in ("a", "b"):
        np.testing.assert_array_equal(first[name], again[name])
        assert not np.array_equal(first[name], other[name])
        assert first[name].flags.c_contiguous
        assert first[name].dtype == np.float32


def test_inputs_with_the_same_generator_get_different_values(tmp_path):
    data = edited(valid_task(), {"inputs.b": {"kind": "uniform", "low": -1.0, "high": 1.0},
                                 "params.1.shape": ["m", "k"]})
    task = load_task(write_task(tmp_path, data))
    arrays = make_inputs(task, {"m": 8, "n": 8, "k": 8}, seed=0)
    assert not np.array_equal(arrays["a"], arrays["b"])


def test_generated_values_respect_their_ranges(task):
    arrays = make_inputs(task, {"m": 300, "n": 300, "k": 300}, seed=3)
    assert arrays["a"].min() >= -1.0 and arrays["a"].max() <= 1.0
    assert abs(float(arrays["b"].mean())) < 0.02 and abs(float(arrays["b"].std()) - 1.0) < 0.02


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_float_dtypes(tmp_path, dtype):
    task = load_task(write_task(tmp_path, integer_aware_task(dtype, C_TYPES[dtype])))
    a = make_inputs(task, {"m": 64, "n": 2, "k": 64}, seed=5)["a"]
    assert a.dtype == DTYPES[dtype]
    values = a.astype(np.float64)
    assert values.min() >= -1.0 and values.max() <= 1.0 and len(np.unique(values)) > 50


@pytest.mark.parametrize(("dtype", "low", "high"), [
    ("int8", -128, 128), ("uint8", 0, 256), ("int32", -5, 5), ("uint32", 2**32 - 4, 2**32),
    ("int64", -(2**62), 2**62)])
def test_integer_generator(tmp_path, dtype, low, high):
    data = integer_aware_task(dtype, C_TYPES[dtype])
    data["inputs"]["a"] = {"kind": "integers", "low": low, "high": high}
    task = load_task(write_task(tmp_path, data))
    a = make_inputs(task, {"m": 100, "n": 2, "k": 100}, seed=9)["a"]
    assert a.dtype == DTYPES[dtype]
    assert int(a.min()) >= low and int(a.max()) < high


def test_integer_generator_excludes_high(tmp_path):
    data = integer_aware_task("int32", "int")
    data["inputs"]["a"] = {"kind": "integers", "low": 0, "high": 2}
    task = load_task(write_task(tmp_path, data))
    a = make_inputs(task, {"m": 50, "n": 2, "k": 50}, seed=1)["a"]
    assert set(np.unique(a).tolist()) == {0, 1}


# ----------------------------------------------------------------------- npy

def npy_task(folder: Path, array: np.ndarray, dtype: str = "float32", sha: str | None = None,
             name: str = "data/a.npy") -> Path:
    digest = write_npy(folder / Path(name).parent, Path(name).name, array)
    data = integer_aware_task(dtype, C_TYPES[dtype])
    data["inputs"]["a"] = {"kind": "npy", "file": name, "sha256": sha or digest}
    data["cases"] = [{"name": "only", "role": "performance", "dims": {"m": 3, "n": 2, "k": 4},
                      "seed": 0}]
    return write_task(folder, data)


def test_npy_input_loads_and_is_returned_as_is(tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    task = load_task(npy_task(tmp_path, array))
    a = make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)["a"]
    np.testing.assert_array_equal(a, array)
    assert a.flags.c_contiguous
    assert task.root / "data" / "a.npy" in task.files()


def test_npy_uppercase_hash_is_accepted(tmp_path):
    array = np.zeros((3, 4), np.float32)
    sha = write_npy(tmp_path / "data", "a.npy", array).upper()
    assert load_task(npy_task(tmp_path, array, sha=sha)).inputs["a"].sha256 == sha


def test_npy_bfloat16_round_trips(tmp_path):
    array = np.linspace(-1, 1, 12).astype(ml_dtypes.bfloat16).reshape(3, 4)
    task = load_task(npy_task(tmp_path, array, dtype="bfloat16"))
    a = make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)["a"]
    assert a.dtype == DTYPES["bfloat16"]
    np.testing.assert_array_equal(a.astype(np.float32), array.astype(np.float32))


def npy_error(folder: Path, **kwargs) -> TaskError:
    with pytest.raises(TaskError) as info:
        load_task(npy_task(folder, **kwargs))
    return info.value


def test_npy_hash_mismatch(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((3, 4), np.float32), sha="ab" * 32)
    assert err.field == "inputs.a.sha256"
    assert "does not match a.npy (its SHA-256 is " in err.message


def test_npy_wrong_shape(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((4, 3), np.float32))
    assert err.field == "inputs.a.file"
    assert "a.npy has shape (4, 3), expected (3, 4)" in err.message


def test_npy_wrong_dtype(tmp_path):
    err = npy_error(tmp_path, array=np.zeros((3, 4), np.float64))
    assert err.field == "inputs.a.file" and "holds float64, expected float32" in err.message


def test_npy_object_arrays_are_refused(tmp_path):
    err = npy_error(tmp_path, array=np.array([[None] * 4] * 3, dtype=object))
    assert err.field == "inputs.a.file" and "not a readable .npy" in err.message


def test_npy_that_is_not_npy(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.npy").write_bytes(b"not numpy")
    sha = hashlib.sha256(b"not numpy").hexdigest()
    data = integer_aware_task("float32", "float")
    data["inputs"]["a"] = {"kind": "npy", "file": "data/a.npy", "sha256": sha}
    err = load_error(tmp_path, data)
    assert err.field == "inputs.a.file" and "not a readable .npy" in err.message


def test_npy_escaping_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    digest = write_npy(outside, "a.npy", np.zeros((3, 4), np.float32))
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "link.npy").symlink_to(outside / "a.npy")
    data = integer_aware_task("float32", "float")
    data["inputs"]["a"] = {"kind": "npy", "file": "link.npy", "sha256": digest}
    err = load_error(folder, data)
    assert err.field == "inputs.a.file" and "escapes the task folder" in err.message


def test_npy_changed_after_load_is_caught(tmp_path):
    task = load_task(npy_task(tmp_path, np.zeros((3, 4), np.float32)))
    np.save(tmp_path / "data" / "a.npy", np.ones((3, 4), np.float32))
    with pytest.raises(TaskError) as info:
        make_inputs(task, {"m": 3, "n": 2, "k": 4}, seed=0)
    assert info.value.field == "inputs.a.sha256"


def test_npy_shape_must_fit_the_requested_dims(tmp_path):
    task = load_task(npy_task(tmp_path, np.zeros((3, 4), np.float32)))
    with pytest.raises(TaskError, match=r"expected \(5, 4\)"):
        make_inputs(task, {"m": 5, "n": 2, "k": 4}, seed=0)


def test_documented_example_loads(tmp_path):
    doc = (Path(__file__).parents[1] / "docs" / "task-format.md").read_text(encoding="utf-8")
    example = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "task.toml").write_text(example, encoding="utf-8")
    for name in ("reference.cu", "initial.cu", "oracle.py"):
        (tmp_path / name).write_text("\n")
    task = load_task(tmp_path)
    assert task.launch.resolve(task.case("tall")) == LaunchGeometry(
        grid=(8, 128, 1), block=(8, 32, 1), shared_bytes=0)
    assert task.launch.resolve(task.case("odd")).grid == (3, 2, 1)
