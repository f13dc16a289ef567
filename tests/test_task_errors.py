"""Manifests load_task refuses: each error names the file, the TOML field and the problem."""

import math
import pickle
import sys

import pytest

from harness.task_model import TaskError
from harness.task import load_task
from tests.test_task import DELETE, KERNEL_SOURCE, edited, load_error, valid_task, write_task


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
     "unknown function 'foo' (allowed: ceil_div, min, max, where)"),
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
    ("reference_launch_membership", {"reference_launch": {"grid": ["m in 1"], "block": [1]}},
     "reference_launch.grid[0]", "operator 'in' is not allowed"),
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


def test_running_the_oracle_writes_nothing_into_the_task_folder(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    from harness.oracle import run_oracle
    from harness.task import load_task, make_inputs

    folder = tmp_path / "matmul_f32"
    shutil.copytree(Path(__file__).parents[1] / "cases" / "matmul_f32", folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as a server started by root without the variable
    task = load_task(folder)
    case = task.cases[0]
    result = run_oracle(task, case.dims, make_inputs(task, case.dims, case.seed))
    assert set(result) == {p.name for p in task.output_params}
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
