"""`kernel-referee check` on a real GPU: the shipped kernels pass and the results are complete."""

import json

import pytest

from server.cli import main
from tests.test_cli import MATMUL

pytestmark = pytest.mark.gpu


def test_check_on_the_shipped_task_passes_and_reports_everything(tmp_path, capsys):
    report = tmp_path / "check.json"
    assert main(["check", str(MATMUL), "--iterations", "30", "--warmups", "3", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "reference vs float64 oracle" in out and "FAILS" not in out
    assert out.count("PASS; score") == 2
    document = json.loads(report.read_text())
    assert document["gpu"]["device"]["compute_capability"][0] >= 7
    for kernel in document["kernels"]:
        assert kernel["passed"]
        assert kernel["compile"]["resources"]["registers"] > 0
        assert {c["case"] for c in kernel["check"]["cases"]} >= {"holdout-97x83x61"}
        assert [c["stats"]["n"] for c in kernel["timing"]["cases"]] == [30, 30]


def test_check_of_a_wrong_kernel_fails_with_its_reason(tmp_path, capsys):
    wrong = tmp_path / "wrong.cu"
    wrong.write_text(MATMUL.joinpath("reference.cu").read_text().replace("sum += a", "sum -= a"))
    assert main(["check", str(MATMUL), "--kernel", str(wrong), "--iterations", "10"]) == 1
    out = capsys.readouterr().out
    assert "rejected: mismatch [odd-31x37x29]" in out and "FAIL" in out
