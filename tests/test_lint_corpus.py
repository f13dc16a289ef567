"""Lint's two corpora: legitimate tasks it must take with no error (edge cases of size 1, integer outputs,
long reductions, float16 and bfloat16, strided and batched shapes, KernelBench-like level-1 problems), and
degenerate ones it must refuse, each with the finding that says why."""

from __future__ import annotations

import pytest

from harness.lint import lint_task
from harness.task import load_task
from server.cli import main
from tests.lint_corpus import UNIFORM, Spec, write_task

SOFTMAX = "e = np.exp(x - x.max(axis=1, keepdims=True))\nreturn {'y': e / e.sum(axis=1, keepdims=True)}"
ROWS = "x:in:float32:rows,cols y:out:float32:rows,cols"
MATMUL = "return {'c': a @ b}"
GEMM = "a:in:float32:m,k b:in:float32:k,n c:out:float32:m,n"

LEGITIMATE = [
    Spec("softmax_rows", ROWS, SOFTMAX, (1e-4, 1e-12),
         ("correctness:rows=1,cols=1", "correctness:rows=37,cols=101", "correctness:rows=5,cols=1",
          "performance:rows=256,cols=1024", "holdout:rows=31,cols=257"), {"x": 'kind = "normal"\nstd = 3.0'}),
    Spec("cumsum_rows", ROWS, "return {'y': np.cumsum(x, axis=1)}", (1e-5, 1e-5),
         ("correctness:rows=4,cols=1", "correctness:rows=33,cols=517", "performance:rows=512,cols=2048",
          "holdout:rows=9,cols=1001")),
    Spec("sum_keepdim", "x:in:float32:rows,cols y:out:float32:rows,one", "return {'y': x.sum(axis=1, keepdims=True)}",
         (1e-5, 1e-5), ("correctness:rows=64,cols=1,one=1", "correctness:rows=65,cols=300,one=1",
                        "performance:rows=4096,cols=512,one=1", "holdout:rows=7,cols=999,one=1")),
    Spec("sum_dim0", "x:in:float32:rows,cols y:out:float32:cols", "return {'y': x.sum(axis=0)}", (1e-5, 1e-5),
         ("correctness:rows=1,cols=300", "correctness:rows=300,cols=5", "performance:rows=2048,cols=2048",
          "holdout:rows=77,cols=91")),
    Spec("rms_norm", "x:in:float32:rows,cols g:in:float32:cols y:out:float32:rows,cols",
         "return {'y': x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g}", (1e-5, 1e-6),
         ("correctness:rows=3,cols=1", "correctness:rows=17,cols=768", "performance:rows=2048,cols=1024",
          "holdout:rows=5,cols=1537"), {"g": 'kind = "uniform"\nlow = 0.5\nhigh = 1.5'}),
    Spec("max_pool_1d", "x:in:float32:rows,cols y:out:float32:rows,half",
         "return {'y': x[:, :2 * half].reshape(rows, half, 2).max(axis=2)}", (0.0, 0.0),
         ("correctness:rows=1,cols=2,half=1", "correctness:rows=13,cols=101,half=50",
          "performance:rows=1024,cols=4096,half=2048", "holdout:rows=3,cols=999,half=499")),
    Spec("max_pool_2d_batched", "x:in:float32:b,h,w y:out:float32:b,hh,hw",
         "return {'y': x.reshape(b, hh, 2, hw, 2).max(axis=(2, 4))}", (0.0, 0.0),
         ("correctness:b=1,h=2,w=2,hh=1,hw=1", "correctness:b=3,h=34,w=18,hh=17,hw=9",
          "performance:b=16,h=256,w=256,hh=128,hw=128", "holdout:b=2,h=10,w=62,hh=5,hw=31")),
    Spec("gemm_irregular", GEMM, MATMUL, (1e-5, 1e-5),
         ("correctness:m=1,k=1,n=1", "correctness:m=97,k=61,n=83", "correctness:m=1,k=200,n=3",
          "performance:m=512,k=512,n=512", "holdout:m=33,k=129,n=65")),
    Spec("gemm_batched", "a:in:float32:bt,m,k b:in:float32:bt,k,n c:out:float32:bt,m,n", MATMUL, (1e-5, 1e-5),
         ("correctness:bt=1,m=1,k=7,n=1", "correctness:bt=3,m=17,k=31,n=9", "performance:bt=8,m=256,k=256,n=256",
          "holdout:bt=2,m=40,k=20,n=30")),
    Spec("argmax_rows", "x:in:float32:rows,cols i:out:int32:rows", "return {'i': x.argmax(axis=1)}", (0.0, 0.0),
         ("correctness:rows=8,cols=1", "correctness:rows=100,cols=33", "performance:rows=4096,cols=1024",
          "holdout:rows=9,cols=513")),
    Spec("add_int32", "a:in:int32:n b:in:int32:n c:out:int32:n", "return {'c': a + b}", (0.0, 0.0),
         ("correctness:n=1", "correctness:n=1001", "performance:n=1048576", "holdout:n=4097"),
         {"a": 'kind = "integers"\nlow = -100\nhigh = 100', "b": 'kind = "integers"\nlow = -1000\nhigh = 1000'}),
    Spec("cumsum_int32", "x:in:int32:n y:out:int32:n", "return {'y': np.cumsum(x)}", (0.0, 0.0),
         ("correctness:n=1", "correctness:n=999", "performance:n=1048576", "holdout:n=3001"),
         {"x": 'kind = "integers"\nlow = -5\nhigh = 6'}),
    Spec("sum_long", "x:in:float32:n y:out:float32:one", "return {'y': np.array([x.sum()])}", (1e-5, 1e-2),
         ("correctness:n=1,one=1", "correctness:n=4194304,one=1", "performance:n=16777216,one=1",
          "holdout:n=1000003,one=1"), {"x": UNIFORM}),
    Spec("softmax_f16", "x:in:float16:rows,cols y:out:float16:rows,cols", SOFTMAX, (2e-3, 1e-7),
         ("correctness:rows=2,cols=1", "correctness:rows=40,cols=1024", "performance:rows=1024,cols=1024",
          "holdout:rows=7,cols=333")),
    Spec("gemm_bf16", "a:in:bfloat16:m,k b:in:bfloat16:k,n c:out:float32:m,n", MATMUL, (1e-5, 1e-5),
         ("correctness:m=1,k=1,n=1", "correctness:m=65,k=257,n=33", "performance:m=512,k=1024,n=512",
          "holdout:m=31,k=64,n=17")),
    Spec("gelu_bf16", "x:in:bfloat16:n y:out:bfloat16:n",
         "from math import erf\nreturn {'y': x * 0.5 * (1 + np.vectorize(erf)(x / np.sqrt(2)))}", (1e-2, 1e-5),
         ("correctness:n=1", "correctness:n=3001", "performance:n=65536", "holdout:n=777")),
    Spec("transpose", "x:in:float32:rows,cols y:out:float32:cols,rows", "return {'y': x.T}", (0.0, 0.0),
         ("correctness:rows=1,cols=7", "correctness:rows=33,cols=65", "correctness:rows=64,cols=64",
          "performance:rows=2048,cols=2048", "holdout:rows=31,cols=127")),
    Spec("strided_slice", "x:in:float32:rows,cols y:out:float32:rows,half",
         "return {'y': x[:, ::2][:, :half]}", (0.0, 0.0),
         ("correctness:rows=1,cols=1,half=1", "correctness:rows=9,cols=101,half=51",
          "performance:rows=2048,cols=4096,half=2048", "holdout:rows=5,cols=30,half=15")),
    Spec("layer_norm", ROWS, "c = x - x.mean(axis=1, keepdims=True)\n"
         "return {'y': c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5)}", (1e-5, 1e-5),
         ("correctness:rows=4,cols=1", "correctness:rows=19,cols=768", "performance:rows=2048,cols=2048",
          "holdout:rows=3,cols=1001")),
    Spec("relu", "x:in:float32:n y:out:float32:n", "return {'y': np.maximum(x, 0)}", (0.0, 0.0),
         ("correctness:n=1", "correctness:n=5000", "performance:n=4194304", "holdout:n=1237")),
    Spec("sigmoid", "x:in:float32:n y:out:float32:n", "return {'y': 1 / (1 + np.exp(-x))}", (1e-6, 1e-7),
         ("correctness:n=2", "correctness:n=5000", "performance:n=4194304", "holdout:n=1237"),
         {"x": 'kind = "normal"\nstd = 2.0'}),
    Spec("tanh", "x:in:float32:n y:out:float32:n", "return {'y': np.tanh(x)}", (1e-6, 1e-7),
         ("correctness:n=1", "correctness:n=5000", "performance:n=4194304", "holdout:n=1237")),
    Spec("max_rows", "x:in:float32:rows,cols y:out:float32:rows", "return {'y': x.max(axis=1)}", (0.0, 0.0),
         ("correctness:rows=6,cols=1", "correctness:rows=100,cols=77", "performance:rows=4096,cols=1024",
          "holdout:rows=3,cols=4001")),
]

DEGENERATE = [
    (Spec("tiny_saxpy", "x:in:float32:n y:in:float32:n out:out:float32:n", "return {'out': 2.5 * x + y}",
          (1e-6, 1e-6), ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001"),
          {"x": 'kind = "uniform"\nlow = -1e-9\nhigh = 1e-9', "y": 'kind = "uniform"\nlow = -1e-9\nhigh = 1e-9'}),
     "zero-output"),
    (Spec("softmax_one_column", ROWS, SOFTMAX, (1e-4, 1e-12),
          ("correctness:rows=37,cols=1", "correctness:rows=5,cols=1", "performance:rows=256,cols=1024",
           "holdout:rows=31,cols=257")), "constant-output"),
    (Spec("cumsum_length_one", ROWS, "return {'y': np.cumsum(x, axis=1)}", (1e-5, 1e-5),
          ("correctness:rows=4,cols=1", "correctness:rows=33,cols=1", "performance:rows=512,cols=2048",
           "holdout:rows=9,cols=1001")), "equals-input"),
    (Spec("softmax_one_hot", ROWS, SOFTMAX, (1e-4, 1e-12),
          ("correctness:rows=37,cols=101", "correctness:rows=5,cols=3", "performance:rows=256,cols=1024",
           "holdout:rows=31,cols=257"), {"x": 'kind = "uniform"\nlow = -1e6\nhigh = 1e6'}), "one-hot-output"),
    (Spec("tanh_saturated", "x:in:float32:n y:out:float32:n", "return {'y': np.tanh(x)}", (1e-6, 1e-7),
          ("correctness:n=64", "correctness:n=100", "performance:n=65536", "holdout:n=99"),
          {"x": 'kind = "normal"\nstd = 1e4'}), "saturated-output"),
    (Spec("iota", "x:in:float32:n y:out:float32:n", "return {'y': np.arange(n, dtype=np.float64)}", (1e-6, 1e-6),
          ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001")), "seed-insensitive"),
    (Spec("holdout_repeats", ROWS, SOFTMAX, (1e-4, 1e-12),
          ("correctness:rows=37,cols=101", "performance:rows=256,cols=1024", "holdout:rows=37,cols=101@1")),
     "holdout-repeats-visible"),
    (Spec("add_one_valued", "a:in:int32:n b:in:int32:n c:out:int32:n", "return {'c': a + b}", (0.0, 0.0),
          ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001"),
          {"a": 'kind = "integers"\nlow = 7\nhigh = 8', "b": 'kind = "integers"\nlow = -1000\nhigh = 1000'}),
     "one-valued-input"),
    (Spec("saxpy_loose", "x:in:float32:n y:in:float32:n out:out:float32:n", "return {'out': 2.5 * x + y}",
          (1e-2, 1e-2), ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001")), "loose-tolerance"),
    (Spec("gemm_loose", GEMM, MATMUL, (1e-2, 1e-1),
          ("correctness:m=97,k=61,n=83", "performance:m=512,k=512,n=512", "holdout:m=33,k=129,n=65")),
     "loose-tolerance"),
    (Spec("softmax_f16_wide_atol", "x:in:float16:rows,cols y:out:float16:rows,cols", SOFTMAX, (1e-3, 1e-3),
          ("correctness:rows=40,cols=1024", "correctness:rows=8,cols=2048", "performance:rows=1024,cols=1024",
           "holdout:rows=7,cols=1333")), "permissive-tolerance"),
    (Spec("noisy_copy", "x:in:float32:n w:in:float32:n y:out:float32:n", "return {'y': x + 0.01 * w}",
          (1e-6, 2e-2), ("correctness:n=5000", "performance:n=1048576", "holdout:n=3001")), "permissive-tolerance"),
    (Spec("softmax_perf_one_column", ROWS, SOFTMAX, (1e-4, 1e-12),
          ("correctness:rows=37,cols=101", "performance:rows=65536,cols=1", "performance:rows=4096,cols=1",
           "holdout:rows=31,cols=257")), "constant-output"),
    (Spec("softmax_holdout_one_column", ROWS, SOFTMAX, (1e-4, 1e-12),
          ("correctness:rows=37,cols=101", "performance:rows=256,cols=1024", "holdout:rows=31,cols=1")),
     "constant-output"),
    (Spec("mask_zero", "x:in:float32:n m:in:int32:n y:out:float32:n", "return {'y': x * m}", (1e-6, 1e-6),
          ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001"),
          {"m": 'kind = "integers"\nlow = 0\nhigh = 1'}), "zero-output"),
    (Spec("relu_positive", "x:in:float32:n y:out:float32:n", "return {'y': np.maximum(x, 0)}", (0.0, 0.0),
          ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001"),
          {"x": 'kind = "uniform"\nlow = 0.0\nhigh = 1.0'}), "equals-input"),
    (Spec("sigmoid_flat", "x:in:float32:n y:out:float32:n", "return {'y': 1 / (1 + np.exp(-x))}", (1e-6, 1e-7),
          ("correctness:n=1001", "performance:n=1048576", "holdout:n=3001"),
          {"x": 'kind = "uniform"\nlow = 50.0\nhigh = 100.0'}), "constant-output"),
]


def errors_of(found) -> list:
    return [f for f in found if f.severity == "error"]


def test_the_corpora_are_as_large_as_promised():
    assert len(LEGITIMATE) >= 20 and len(DEGENERATE) >= 15
    assert len({s.name for s in LEGITIMATE} | {s.name for s, _ in DEGENERATE}) == len(LEGITIMATE) + len(DEGENERATE)


@pytest.mark.parametrize("spec", LEGITIMATE, ids=[s.name for s in LEGITIMATE])
def test_lint_takes_every_legitimate_task(tmp_path, spec):
    found = lint_task(load_task(write_task(spec, tmp_path)))
    assert errors_of(found) == [], [f.line() for f in found]


@pytest.mark.parametrize("spec,check", DEGENERATE, ids=[s.name for s, _ in DEGENERATE])
def test_lint_refuses_every_degenerate_task_for_its_cause(tmp_path, spec, check):
    found = lint_task(load_task(write_task(spec, tmp_path)))
    assert check in {f.check for f in errors_of(found)}, [f.line() for f in found]
