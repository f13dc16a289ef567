"""new-task proposes a `[vendor]` cuBLAS gemm for a GEMM-shaped signature (the cuBLAS column of check and the
report), says so, and leaves it out where the shapes or dtypes are not a gemm cuBLAS takes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from harness.new_task import Sources, create_task
from harness.new_task_vendor import gemm_vendor
from harness.task_model import Param, Vendor
from server.cli import main

REPO = Path(__file__).resolve().parents[1]
MATMUL = REPO / "cases" / "matmul_f32"
SIGNATURE = 'extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)'
README_CASES = {
    "params": {"a": {"shape": ["m", "k"]},
               "b": {"shape": ["k", "n"], "distribution": {"kind": "normal", "std": 1.0}},
               "c": {"shape": ["m", "n"], "reduction": "k"}},
    "launch": {"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"], "block": [16, 16]},
    "cost": {"flops": "2 * m * n * k", "bytes": "4 * (m * k + k * n + m * n)"},
    "cases": [{"name": "odd-31x37x29", "dims": {"m": 31, "n": 37, "k": 29}},
              {"name": "square-2048", "dims": {"m": 2048, "n": 2048, "k": 2048}},
              {"name": "holdout-97x83x61", "dims": {"m": 97, "n": 83, "k": 61}, "role": "holdout"}]}


def array(name: str, kind: str, dtype: str, *shape: str) -> Param:
    return Param(name=name, kind=kind, dtype=dtype, shape=shape)


def test_the_readme_matmul_gets_the_shipped_tasks_vendor_table_and_says_so(tmp_path, capsys):
    (tmp_path / "cases.json").write_text(json.dumps(README_CASES))
    folder = tmp_path / "matmul"
    assert main(["new-task", str(folder), "--description", "C = A B.", "--signature", SIGNATURE,
                 "--reference", str(MATMUL / "reference.cu"), "--initial-kernel", str(MATMUL / "initial.cu"),
                 "--input-cases", str(tmp_path / "cases.json"), "--oracle", str(MATMUL / "oracle.py")]) == 0
    out = capsys.readouterr().out
    assert "inferred: [vendor] cuBLAS gemm c = a (m x k) x b (k x n), a yardstick" in out
    written = tomllib.loads((folder / "task.toml").read_text())["vendor"]
    shipped = tomllib.loads((MATMUL / "task.toml").read_text())["vendor"]
    assert written == shipped == {"library": "cublas", "op": "gemm", "a": "a", "b": "b", "c": "c",
                                  "m": "m", "n": "n", "k": "k"}


def test_the_operands_are_found_in_any_order_of_the_signature():
    params = [array("x", "input", "bfloat16", "k", "n"), array("w", "input", "bfloat16", "rows", "k"),
              array("y", "output", "float32", "rows", "n")]
    assert gemm_vendor(params) == Vendor(library="cublas", op="gemm", a="w", b="x", c="y", m="rows", n="n", k="k")


@pytest.mark.parametrize("params", [
    [array("a", "input", "float32", "m", "k"), array("b", "input", "float32", "n", "k"),   # B transposed
     array("c", "output", "float32", "m", "n")],
    [array("a", "input", "float64", "m", "k"), array("b", "input", "float64", "k", "n"),   # no float64 gemm
     array("c", "output", "float64", "m", "n")],
    [array("a", "input", "float16", "m", "k"), array("b", "input", "bfloat16", "k", "n"),  # mixed inputs
     array("c", "output", "float32", "m", "n")],
    [array("x", "input", "float32", "n"), array("y", "input", "float32", "n"), array("out", "output", "float32", "n")],
    [array("a", "input", "float32", "b", "m", "k"), array("b", "input", "float32", "b", "k", "n"),  # batched
     array("c", "output", "float32", "b", "m", "n")],
], ids=["transposed", "float64", "mixed", "elementwise", "batched"])
def test_shapes_or_dtypes_that_are_no_cublas_gemm_get_no_vendor(params):
    assert gemm_vendor(params) is None


def test_a_case_beyond_cublas_sizes_drops_the_vendor_and_says_why(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void mm(const float* a, const float* b, float* c) {}\n')
    spec = {"params": {"a": {"shape": ["m", "k"]}, "b": {"shape": ["k", "n"]}, "c": {"shape": ["m", "n"]}},
            "launch": {"grid": [1], "block": [32]},
            "cases": [{"name": "small", "role": "correctness", "dims": {"m": 8, "n": 8, "k": 8}},
                      {"name": "huge-k", "role": "performance", "dims": {"m": 1, "n": 1, "k": 2**31}}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    made = create_task(tmp_path / "mm", description="C = A B.",
                       signature='extern "C" __global__ void mm(const float* a, const float* b, float* c)',
                       sources=Sources(reference=tmp_path / "k.cu", initial=tmp_path / "k.cu"),
                       cases_file=tmp_path / "cases.json")
    assert made.task.vendor is None and "[vendor]" not in (tmp_path / "mm" / "task.toml").read_text()
    (note,) = [line for line in made.plan.inferred if line.startswith("no [vendor] after all")]
    assert "vendor.k" in note and "huge-k" in note
