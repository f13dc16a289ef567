"""A reference that leaves outputs unwritten is told as such: on the host (its two runs' outputs still hold each
run's poison), from the device's kept facts, and by lint where the oracle's outputs are NaN. And `kernel-referee
lint` prints the stand-in that passed."""

from __future__ import annotations

import numpy as np
import pytest

from harness import jobs
from harness.device_checks import _read_kept
from harness.judging import reference_unwritten
from harness.lint import lint_task
from harness.settings import ReferenceFailed
from harness.task import load_task
from harness.worker_side import buffers
from server.cli import main
from tests.lint_corpus import Spec, write_task


def _runs(written: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two runs of a kernel writing 1.5 where `written`, each over its own poison."""
    runs = []
    for byte in buffers.POISON_BYTES:
        out = np.frombuffer(bytes([byte]) * 4 * written.size, dtype=np.float32).reshape(written.shape).copy()
        out[written] = 1.5
        runs.append(out)
    return runs[0], runs[1]


def test_a_reference_leaving_elements_unwritten_is_said_so_on_the_host():
    written = np.ones((4, 6), dtype=bool)
    written[2, 3:] = False
    said = reference_unwritten("y", *_runs(written))
    assert said == ("it leaves 3 of 24 elements of y unwritten (first at [2, 3]; they still hold the poison after "
                    "both runs): a reference must write every element of every output")
    assert reference_unwritten("y", *_runs(np.ones((4, 6), dtype=bool))) is None


def _kept_answer(**fact) -> dict:
    return {"kept": [{"name": "y", "tree_sha256": "0" * 64, "differ": 12, "mismatches": 0,
                      "spread": {"nonfinite": 0, "finite_min_key": 0, "finite_max_key": 0}, "poison_count": 0, **fact}]}


def test_the_device_facts_of_unwritten_elements_are_said_so_not_as_nondeterminism():
    layout = jobs.Layout((("array", jobs.ArraySpec("y", "output", "float32", (4, 6))),))
    with pytest.raises(ReferenceFailed) as caught:
        _read_kept(_kept_answer(unwritten=3, first_unwritten=15), layout, "k", "odd")
    assert "leaves 3 of 24 elements of y unwritten (first at [2, 3]" in str(caught.value)
    assert "not deterministic" not in str(caught.value)
    with pytest.raises(ReferenceFailed, match="not deterministic"):
        _read_kept(_kept_answer(unwritten=0, mismatches=5), layout, "k", "odd")


def test_lint_warns_where_the_oracle_leaves_outputs_nan(tmp_path):
    spec = Spec("half_written", "x:in:float32:n y:out:float32:n",
                "y = x.copy() * 2\ny[n // 2:] = np.nan\nreturn {'y': y}", (1e-6, 1e-6),
                ("correctness:n=1000", "performance:n=1048576", "holdout:n=3001"))
    found = lint_task(load_task(write_task(spec, tmp_path)))
    nan = [f for f in found if f.check == "unwritten-output"]
    assert [f.severity for f in nan] == ["warning"]
    assert nan[0].message.startswith("case correctness-1: the oracle's y is NaN on 500 of 1000 elements (first at "
                                     "[500]): a reference that leaves them unwritten is refused on the GPU")


def test_lint_prints_the_stand_in_that_passed(tmp_path, capsys):
    spec = Spec("softmax_one_column", "x:in:float32:rows,cols y:out:float32:rows,cols",
                "e = np.exp(x - x.max(axis=1, keepdims=True))\nreturn {'y': e / e.sum(axis=1, keepdims=True)}",
                (1e-4, 1e-12), ("correctness:rows=37,cols=1", "correctness:rows=5,cols=1",
                                "performance:rows=256,cols=1024", "holdout:rows=31,cols=257"))
    folder = write_task(spec, tmp_path)
    assert main(["lint", str(folder)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert ("error: constant-output: stand-in 'y written as one value everywhere' passes every correctness case "
            "(correctness-1, correctness-2) (tolerance.y rtol 0.0001, atol 1e-12; no atol would refuse it): the "
            "output is (near) constant") in lines
