"""Loading task manifests that are valid, and the Task API; helpers shared by test_task_*.py.

Manifests are built as dicts (``valid_task`` and ``edited``) and written out as
TOML, so each test states only what it changes.
"""

import copy
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tomllib

from harness.task import load_task, make_inputs
from harness.task_model import (C_TYPE_SPELLINGS, C_TYPES, DTYPES, Case, Generator, LaunchGeometry, LaunchSpec, Param,
                                Task, TaskError, Tolerance, parse_signature)

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


def integer_aware_task(dtype: str, spelling: str) -> dict:
    """The valid task with input 'a' switched to ``dtype`` spelled as ``spelling``."""
    generator = ({"kind": "integers", "low": 0, "high": 100} if DTYPES[dtype].kind in "iu"
                 else {"kind": "uniform", "low": -1.0, "high": 1.0})
    return edited(valid_task(), {
        "params.0.dtype": dtype, "inputs.a": generator,
        "kernel.signature": SIGNATURE.replace("const float* a", f"const {spelling}* a"),
    })


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


# ----------------------------------------------------------- documentation

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


def test_the_tasks_own_kernels_take_their_own_launch_or_the_default():
    root = Path(__file__).resolve().parents[1] / "cases"
    softmax, matmul = load_task(root / "softmax_f32"), load_task(root / "matmul_f32")
    assert softmax.reference_launch is not None and softmax.own_launch("reference") == softmax.reference_launch
    assert softmax.reference_launch != softmax.launch and softmax.own_launch("initial") == softmax.launch
    assert matmul.reference_launch is None and matmul.own_launch("reference") == matmul.launch
    with pytest.raises(ValueError):
        matmul.own_launch("candidate")
