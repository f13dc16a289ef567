"""Lint compiles the task's reference and initial kernels (NVRTC on the CPU, in the confined compile worker) and
checks the signature's kernel name against what they define; `check` without a GPU refuses a kernel that does not
compile or a launch that cannot run with exit 2, not the 'no GPU' exit."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from harness import lint as lint_module
from harness.lint import lint_before_run, lint_folder
from harness.lint_compile import compile_findings, defined_kernels
from harness.settings import TimingSettings
from harness.task import load_task
from server import check, cli
from server import serve as serve_module
from server.cli import main
from tests.fake_executor import FakeExecutor

REPO = Path(__file__).resolve().parents[1]
MATMUL = REPO / "cases" / "matmul_f32"
SAXPY = REPO / "tests" / "fixtures" / "tasks" / "saxpy"
BROKEN = "extern \"C\" __global__ void saxpy(const float* x, const float* y, float* out, float alpha, int n)\n" \
         "{\n    out[0] = undeclared_name;\n}\n"


def copy_of(tmp_path: Path, base: Path = SAXPY) -> Path:
    folder = tmp_path / base.name
    shutil.copytree(base, folder)
    return folder


def renamed_kernel(tmp_path: Path) -> Path:
    """matmul_f32 whose kernel.name and signature say `other`, while its kernels define matmul_f32."""
    folder = copy_of(tmp_path, MATMUL)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[kernel]\nname = \"matmul_f32\"", "[kernel]\nname = \"other\"")
                    .replace("__global__ void matmul_f32(", "__global__ void other("))
    return folder


def test_the_kernels_a_source_defines_are_read_past_comments_and_launch_bounds():
    source = ('// __global__ void commented(int n)\n/* __global__ void hidden(\n) */\n'
              'extern "C" __global__ void __launch_bounds__(256, 2) first(float* x) {}\n'
              'template <int N>\n__global__ void\nsecond(const float* __restrict__ y) {}\n'
              '__device__ float helper(float v) { return v; }\n')
    assert defined_kernels(source) == ["first", "second"]


def test_shipped_kernels_compile_with_no_finding():
    assert compile_findings(load_task(MATMUL)) == []


def test_a_signature_naming_a_kernel_the_sources_do_not_define_is_refused(tmp_path, capsys):
    folder = renamed_kernel(tmp_path)
    found = [f for f in lint_folder(folder)[1] if f.severity == "error"]
    assert [(f.check, f.message.split(",")[0]) for f in found[:2]] == [
        ("kernel-name", "the signature names kernel 'other'"), ("kernel-name", "the signature names kernel 'other'")]
    assert "but reference.cu defines matmul_f32" in found[0].message
    assert "but initial.cu defines matmul_f32" in found[1].message
    assert main(["lint", str(folder)]) == 1
    assert "error: kernel-name: the signature names kernel 'other'" in capsys.readouterr().out


@pytest.mark.parametrize("file", ["reference.cu", "initial.cu"])
def test_a_kernel_that_does_not_compile_is_a_lint_error_naming_its_file_and_error(tmp_path, capsys, file):
    folder = copy_of(tmp_path)
    (folder / file).write_text(BROKEN)
    found = lint_folder(folder)[1]
    (wrong,) = [f for f in found if f.check == "compile"]
    assert wrong.severity == "error" and found[0] == wrong  # a kernel that does not compile comes first
    assert wrong.message.startswith(f"{file} does not compile for sm_90") and "undeclared_name" in wrong.message
    assert main(["lint", str(folder)]) == 1
    assert f"error: compile: {file} does not compile" in capsys.readouterr().out


def test_the_lint_before_a_run_compiles_too(tmp_path):
    folder = copy_of(tmp_path)
    (folder / "reference.cu").write_text(BROKEN)
    assert ("error", "compile") in {(f.severity, f.check) for f in lint_before_run(load_task(folder), TimingSettings())}


@pytest.mark.parametrize("command", [["check"], ["serve", "--task"]])
def test_check_and_serve_refuse_a_reference_that_does_not_compile_with_exit_2(tmp_path, capsys, monkeypatch,
                                                                               command):
    monkeypatch.setattr(check, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    folder = copy_of(tmp_path)
    (folder / "reference.cu").write_text(BROKEN)
    assert main([*command, str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "fails lint: error: compile: reference.cu does not compile" in err[0]


@pytest.mark.parametrize("launch, said", [
    ('{"grid": ["zz"], "block": [256]}', "--launch grid[0]: unknown name 'zz'"),
    ('{"grid": ["ceil_div(n, 256)"], "block": [100000]}', "--launch block[0]: 100000 exceeds the CUDA limit of 1024"),
    ('{"grid": [1], "block": [64, 64]}', "--launch block: 4096 threads per block exceeds the CUDA limit"),
])
def test_check_without_a_gpu_refuses_a_launch_that_cannot_run_with_exit_2(tmp_path, capsys, monkeypatch, launch,
                                                                          said):
    monkeypatch.setattr(check, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    kernel = tmp_path / "k.cu"
    kernel.write_text((SAXPY / "reference.cu").read_text())
    assert main(["check", str(SAXPY), "--kernel", str(kernel), "--launch", launch]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kernel-referee check: ") and said in err[0]


def test_check_without_a_gpu_fails_a_given_kernel_that_does_not_compile_not_no_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(check, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    kernel = tmp_path / "k.cu"
    kernel.write_text(BROKEN)
    assert main(["check", str(SAXPY), "--kernel", str(kernel)]) == check.EXIT_FAILED
    out = capsys.readouterr().out
    assert f"{kernel}: compile FAILED" in out and f"{kernel} does not compile for sm_90: FAIL" in out


def test_new_task_lints_with_the_compiles_and_names_a_kernel_the_sources_do_not_define(tmp_path, capsys):
    cases = tmp_path / "cases.json"
    cases.write_text('{"launch": {"grid": ["ceil_div(n, 256)"], "block": [256]}, "params": {"alpha": {"value": 2.5}},'
                     ' "cases": [{"name": "odd", "dims": {"n": 1001}, "role": "correctness"},'
                     ' {"name": "big", "dims": {"n": 1048576}, "role": "performance"}]}')
    signature = ('extern "C" __global__ void other(const float* __restrict__ x, const float* __restrict__ y, '
                 "float* __restrict__ out, float alpha, int n)")
    assert main(["new-task", str(tmp_path / "t"), "--description", "saxpy", "--signature", signature,
                 "--reference", str(SAXPY / "reference.cu"), "--initial-kernel", str(SAXPY / "initial.cu"),
                 "--input-cases", str(cases)]) == 1
    assert "error: kernel-name: the signature names kernel 'other', but reference.cu defines saxpy" in \
        capsys.readouterr().out


def test_serve_on_a_gpu_serves_before_the_lint_compiles_and_its_preparation_refuses_a_broken_kernel(
        tmp_path, capsys, monkeypatch):
    folder = copy_of(tmp_path, MATMUL)
    (folder / "reference.cu").write_text((folder / "reference.cu").read_text().replace("sum +=", "sum += undeclared +"))
    serving, compiled = threading.Event(), []

    def compiles_once_served(task, **options):
        assert serving.wait(30)  # the compiles wait for serving to begin: initialize is never behind them
        compiled.append(task.name)
        return compile_findings(task, **options)

    def served(run, *args, **options):
        serving.set()
        run.preparation.wait(120)

    monkeypatch.setattr(lint_module, "compile_findings", compiles_once_served)
    monkeypatch.setattr(serve_module, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(cli, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(serve_module, "GpuExecutor", lambda task, timing, **options: FakeExecutor(task))
    monkeypatch.setattr(serve_module, "build_server", lambda run, **options: run)
    monkeypatch.setattr(serve_module.transport, "run", served)
    code = main(["serve", "--task", str(folder), "--results", str(tmp_path / "results"), "--no-sandbox"])
    err = capsys.readouterr().err
    assert code == 2 and compiled == ["matmul_f32"] and "Traceback" not in err
    assert "  checking that the task's reference and initial kernels compile" in err.splitlines()
    assert err.splitlines()[-1].startswith("kernel-referee: the run could not be prepared: refused: task matmul_f32 "
                                           "fails lint: error: compile: reference.cu does not compile")
    assert not list((tmp_path / "results").glob("run-*")) and not list((tmp_path / "results").glob(".preparing-*"))
