"""new-task's proposals pass its own lint: for every float dtype it accepts, shapes with and without rows, and
reductions from 1 to 2^28 terms (the long ones in performance cases, as a person writes them), the task
new-task writes has no lint error. A tolerance the cases file gives and lint refuses is said with the stand-in
that passed and a tolerance that would refuse it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.lint import lint_task
from harness.lint_findings import errors
from harness.new_task import Sources, create_task
from harness.task import load_task
from server.cli import main

C_TYPES = {"float32": "float", "float64": "double", "float16": "__half", "bfloat16": "__nv_bfloat16"}
KERNEL = "extern \"C\" __global__ void rowsum(const float* x, float* out, int rows, int k) {}\n"
ORACLE = ("import numpy as np\n\n\ndef oracle(inputs, dims):\n"
          "    return {'out': inputs['x'].astype(np.float64).sum(axis=-1)}\n")
MAX_REDUCTION_LOG2 = 28


def signature(in_dtype: str, out_dtype: str) -> str:
    return (f'extern "C" __global__ void rowsum(const {C_TYPES[in_dtype]}* x, {C_TYPES[out_dtype]}* out, '
            "int rows, int k)")


def sources(tmp_path: Path) -> Sources:
    (tmp_path / "k.cu").write_text(KERNEL)
    (tmp_path / "oracle.py").write_text(ORACLE)
    return Sources(reference=tmp_path / "k.cu", initial=tmp_path / "k.cu", oracle=tmp_path / "oracle.py")


def row_sums(tmp_path: Path, folder: str, in_dtype: str, out_dtype: str, cases: list[dict],
             tolerance: dict | None = None):
    """A task summing each row of x (rows x k) into out, made by new-task with `reduction = "k"`."""
    out = {"shape": ["rows"], "reduction": "k"} | ({"tolerance": tolerance} if tolerance else {})
    spec = {"params": {"x": {"shape": ["rows", "k"]}, "out": out},
            "launch": {"grid": ["rows"], "block": [256]}, "cases": cases}
    path = tmp_path / f"{folder}.json"
    path.write_text(json.dumps(spec))
    return create_task(tmp_path / folder, description="Row sums.", signature=signature(in_dtype, out_dtype),
                       sources=sources(tmp_path), cases_file=path)


FLOATS = st.sampled_from(sorted(C_TYPES))


@st.composite
def reductions(draw) -> tuple[int, int, int, int]:
    """(rows, k) of a correctness case, then of a performance case whose k reaches 2^28 and whose elements stay
    within 2^28."""
    small_k = draw(st.integers(1, 4096))
    small_rows = draw(st.integers(8, 64))  # fewer output elements: one value everywhere passes, rightly refused
    long_k = max(1, 2 ** draw(st.integers(0, MAX_REDUCTION_LOG2)) - draw(st.integers(0, 3)))
    long_rows = draw(st.integers(1, min(4096, (1 << MAX_REDUCTION_LOG2) // long_k)))
    return small_rows, small_k, long_rows, long_k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(in_dtype=FLOATS, out_dtype=FLOATS, shape=reductions())
def test_every_proposal_passes_lint(tmp_path_factory, in_dtype, out_dtype, shape):
    small_rows, small_k, long_rows, long_k = shape
    tmp_path = tmp_path_factory.mktemp("proposal")
    made = row_sums(tmp_path, "rowsum", in_dtype, out_dtype, [
        {"name": "small", "role": "correctness", "dims": {"rows": small_rows, "k": small_k}},
        {"name": "long", "role": "performance", "dims": {"rows": long_rows, "k": long_k}},
        {"name": "hidden", "role": "holdout", "dims": {"rows": small_rows + 1, "k": 2 * small_k + 1}}])
    wrong = errors(lint_task(made.task))
    assert wrong == [], (made.tolerances["out"], [f.line() for f in wrong])


@pytest.mark.parametrize("long_k", [1 << 14, 1 << 26])
def test_the_reported_refusals_are_gone(tmp_path, long_k):
    """A float32 sum of 2^26 elements (one row), and a performance case of k = 16384 beside small correctness
    cases: both were refused by new-task's own lint."""
    made = row_sums(tmp_path, "sum", "float32", "float32", [
        {"name": "few", "role": "correctness", "dims": {"rows": 7, "k": 33}},
        {"name": "some", "role": "correctness", "dims": {"rows": 3, "k": 1000}},
        {"name": "long", "role": "performance", "dims": {"rows": 1, "k": long_k}}])
    assert errors(lint_task(made.task)) == []
    proposal = made.tolerances["out"]
    assert proposal.rtol <= 2.0**-11 / 4  # a TF32 version moves a sum by about 2^-11 of its size: refused


def test_the_comment_never_says_a_lower_precision_version_is_within_the_tolerance(tmp_path):
    made = row_sums(tmp_path, "sum", "float32", "float32", [
        {"name": "few", "role": "correctness", "dims": {"rows": 7, "k": 33}},
        {"name": "long", "role": "performance", "dims": {"rows": 1, "k": 1 << 26}}])
    comment = " ".join(line.lstrip("# ") for line in made.tolerances["out"].comment)
    ratio = float(comment.split("of their size, ")[1].split("x rtol")[0])
    assert ratio >= 4 and "fails" in comment


def test_a_refused_tolerance_of_the_cases_file_is_said_with_the_stand_in_a_refusing_tolerance_and_the_proposal(
        tmp_path, capsys):
    spec = {"params": {"x": {"shape": ["rows", "k"]},
                       "out": {"shape": ["rows"], "reduction": "k", "tolerance": {"rtol": 1e-5, "atol": 1e-2}}},
            "launch": {"grid": ["rows"], "block": [256]},
            "cases": [{"name": "few", "role": "correctness", "dims": {"rows": 7, "k": 33}},
                      {"name": "long", "role": "performance", "dims": {"rows": 1, "k": 1 << 26}},
                      {"name": "hidden", "role": "holdout", "dims": {"rows": 9, "k": 65}}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    src = sources(tmp_path)
    folder = tmp_path / "sum"
    assert main(["new-task", str(folder), "--description", "Row sums.", "--signature", signature("float32", "float32"),
                 "--reference", str(src.reference), "--initial-kernel", str(src.initial), "--oracle", str(src.oracle),
                 "--input-cases", str(tmp_path / "cases.json")]) == 1
    out = capsys.readouterr().out
    proposed = load_task(folder)  # kept, to be edited
    assert proposed.tolerances["out"].rtol == 1e-5 and proposed.tolerances["out"].atol == 1e-2
    said = next(line for line in out.splitlines() if line.startswith("tolerance of out: "))
    assert said.startswith("tolerance of out: rtol 1e-05, atol 0.01 (the cases file's; new-task would propose rtol 6e-05")
    refusal = next(line for line in out.splitlines() if line.startswith("error: loose-tolerance: "))
    assert "TF32" in refusal and "would refuse it" in refusal
    assert "# Tolerance of out: as the cases file gives it. new-task would propose rtol 6e-05" in \
        (folder / "task.toml").read_text()


SOFTMAX_ORACLE = ("import numpy as np\n\n\ndef oracle(inputs, dims):\n"
                  "    x = inputs['x'].astype(np.float64)\n"
                  "    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
                  "    return {'y': e / e.sum(axis=-1, keepdims=True)}\n")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(dtype=FLOATS, small_cols=st.integers(8, 512), long_cols_log2=st.integers(10, 18))
def test_a_softmax_with_reduction_over_its_rows_as_task_format_advises_passes_lint(tmp_path_factory, dtype,
                                                                                     small_cols, long_cols_log2):
    """A normalization's outputs shrink as its rows grow (about 1 / cols): the atol must stay under the smallest,
    or an all-zero output passes most elements of the long rows."""
    tmp_path = tmp_path_factory.mktemp("softmax")
    (tmp_path / "k.cu").write_text(KERNEL)
    (tmp_path / "oracle.py").write_text(SOFTMAX_ORACLE)
    long_cols = 1 << long_cols_log2
    spec = {"params": {"x": {"shape": ["rows", "cols"]}, "y": {"shape": ["rows", "cols"], "reduction": "cols"}},
            "launch": {"grid": ["rows"], "block": [256]},
            "cases": [{"name": "narrow", "role": "correctness", "dims": {"rows": 16, "cols": small_cols}},
                      {"name": "wide", "role": "performance", "dims": {"rows": max(1, (1 << 22) // long_cols),
                                                                      "cols": long_cols}},
                      {"name": "hidden", "role": "holdout", "dims": {"rows": 9, "cols": 2 * small_cols + 1}}]}
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    made = create_task(tmp_path / "softmax", description="Softmax over rows.",
                       signature=f'extern "C" __global__ void rowsum(const {C_TYPES[dtype]}* x, {C_TYPES[dtype]}* y, '
                                 "int rows, int cols)",
                       sources=Sources(reference=tmp_path / "k.cu", initial=tmp_path / "k.cu",
                                       oracle=tmp_path / "oracle.py"), cases_file=tmp_path / "cases.json")
    wrong = errors(lint_task(made.task))
    assert wrong == [], (made.tolerances["y"], [f.line() for f in wrong])
    assert made.tolerances["y"].atol < 0.5 / long_cols  # under the long rows' outputs, which are about 1 / cols
