"""`kernel-referee check` through its real entry point."""

import json
from pathlib import Path

import pytest

from harness.device import gpu_absent_reason
from server.cli import main

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
no_gpu = pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU")


@no_gpu
def test_check_without_gpu_compiles_everything_and_says_why(capsys):
    assert main(["check", str(MATMUL)]) == 3
    out = capsys.readouterr().out
    assert "reference: compiled for sm_90" in out and "initial: compiled for sm_90" in out
    assert "registers" in out and "2112 B shared" in out
    assert "No GPU: no NVIDIA driver library" in out
    assert "running, checking and timing need an NVIDIA GPU" in out


@no_gpu
def test_check_of_a_file_that_does_not_compile_shows_its_log(tmp_path, capsys):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void matmul_f32(const float* a) { undefined_thing; }')
    # A kernel that does not compile has failed, GPU or not (exit 1), not "no GPU" (3)
    assert main(["check", str(MATMUL), "--kernel", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "compile FAILED" in out and "undefined_thing" in out


@no_gpu
def test_check_writes_json_results(tmp_path):
    report = tmp_path / "out.json"
    assert main(["check", str(MATMUL), "--json", str(report)]) == 3
    document = json.loads(report.read_text())
    assert document["task"] == "matmul_f32" and document["gpu"] is None
    assert [k["label"] for k in document["kernels"]] == ["reference", "initial"]
    assert document["kernels"][1]["compile"]["resources"]["shared_bytes"] == 2112
    assert document["kernels"][1]["check"] is None and document["kernels"][1]["passed"] is False


def test_a_broken_task_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "task.toml").write_text("name = 'x'\n")
    assert main(["check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "task.toml") in err


def test_a_bad_launch_is_a_clear_error(tmp_path, capsys):
    kernel = tmp_path / "k.cu"
    kernel.write_text((MATMUL / "initial.cu").read_text())
    assert main(["check", str(MATMUL), "--kernel", str(kernel), "--launch", json.dumps({"grid": [1]})]) == 2
    assert capsys.readouterr().err == ("kernel-referee check: --launch is not a valid launch geometry: LaunchSpec: "
                                       "block: Field required\n")
