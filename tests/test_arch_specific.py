"""The device's architecture-specific target (sm_90a on a 9.0 device): asked for with -arch=sm_90a, compiled with
the real NVRTC (no GPU needed), recorded with the candidate and the attempt, and compiled again by replay."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from harness.compile_cache import CompileCache
from harness.compile_service import CompileService
from harness.nvrtc_features import nvrtc_features
from harness.worker_side.compile_policy import CompileRefused, check_options
from harness.worker_side.nvrtc import compile_kernel, nvrtc_version, supported_archs
from server.attempt import finish, record_attempt
from server.replay import replay
from tests.fake_executor import FakeExecutor
from tests.server_support import INITIAL, new_run, read_json

ELF_MAGIC = b"\x7fELF"
WGMMA_MATMUL = Path(__file__).resolve().parent / "gpu" / "kernels" / "wgmma_bf16.cu"
PLAIN = 'extern "C" __global__ void plain(float* x) { x[threadIdx.x] *= 2.0f; }'
# wgmma exists on sm_90a only: ptxas refuses it for the plain sm_90.
WGMMA = r"""
extern "C" __global__ void fenced(float* x) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    x[threadIdx.x] = 1.0f;
}
"""
# The matmul task's baseline with a wgmma fence on a path never taken: it compiles only for sm_90a.
MATMUL_WGMMA = INITIAL.replace("{", '{\n    if (m < 0) asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");', 1) \
    + "\n// fake: latency_us=50\n"


def test_the_devices_arch_specific_target_compiles_to_a_cubin_for_it():
    compiled = compile_kernel(PLAIN, "plain", options=["-arch=sm_90a"], arch="sm_90")
    assert compiled.ok, compiled.log
    assert compiled.arch == "sm_90a" and compiled.options == ("-arch=sm_90a",)
    assert compiled.cubin.startswith(ELF_MAGIC) and "for 'sm_90a'" in compiled.full_log
    long_form = compile_kernel(PLAIN, "plain", options=["--gpu-architecture=sm_90a"], arch="sm_90")
    assert long_form.ok and long_form.arch == "sm_90a"
    assert compile_kernel(PLAIN, "plain", arch="sm_90").arch == "sm_90"


@pytest.mark.parametrize("option", ["-arch=sm_80", "-arch=sm_100a", "-arch=sm_90", "--gpu-architecture=sm_89a",
                                    "-arch=compute_90a", "-arch=sm_90a -G", "-arch=sm_90a\n-G", "-gencode=arch=compute_90a,code=sm_90a",
                                    "-arch"])
def test_any_other_architecture_is_refused_in_one_line(option):
    with pytest.raises(CompileRefused) as refused:
        compile_kernel(PLAIN, "plain", options=[option], arch="sm_90")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"option {option!r} is refused: ")
    assert message.endswith("its architecture-specific target, -arch=sm_90a")


def test_the_allowed_target_follows_the_device():
    assert check_options(["-arch=sm_100a"], "sm_100") == ("-arch=sm_100a",)
    with pytest.raises(CompileRefused, match="-arch=sm_100a"):
        check_options(["-arch=sm_90a"], "sm_100")  # another device's target
    with pytest.raises(CompileRefused, match="architecture"):
        check_options(["-arch=sm_90a"])  # no device named: no architecture may be asked for


def test_a_wgmma_kernel_compiles_with_sm_90a_and_fails_without_it_saying_how():
    assert compile_kernel(WGMMA, "fenced", options=["-arch=sm_90a"], arch="sm_90").ok
    plain = compile_kernel(WGMMA, "fenced", arch="sm_90")
    assert not plain.ok and "wgmma" in plain.full_log
    assert plain.log.splitlines()[0].endswith("compile with the option -arch=sm_90a")


def test_the_gpu_tests_wgmma_matmul_compiles_with_sm_90a_only():
    source = WGMMA_MATMUL.read_text()
    compiled = compile_kernel(source, "matmul_bf16", options=["-arch=sm_90a"], arch="sm_90")
    assert compiled.ok and compiled.resources.registers > 0, compiled.log
    plain = compile_kernel(source, "matmul_bf16", arch="sm_90")
    assert not plain.ok and "wgmma.mma_async" in plain.full_log


def test_the_cache_key_includes_the_target():
    cache = CompileCache()
    plain = compile_kernel(PLAIN, "plain", arch="sm_90", cache=cache)
    specific = compile_kernel(PLAIN, "plain", options=["-arch=sm_90a"], arch="sm_90", cache=cache)
    assert plain.key != specific.key and not specific.cache_hit and len(cache) == 2
    again = compile_kernel(PLAIN, "plain", options=["-arch=sm_90a"], arch="sm_90", cache=cache)
    assert again.cache_hit and again.arch == "sm_90a" and again.cubin == specific.cubin


def test_the_compile_worker_compiles_for_the_target_and_its_answer_is_accepted():
    with CompileService(confine=False) as service:
        compiled = service.compile(WGMMA, "fenced", ["-arch=sm_90a"], "sm_90")
        assert compiled.ok and compiled.arch == "sm_90a" and not compiled.cache_hit, compiled.log
        plain = service.compile(WGMMA, "fenced", [], "sm_90")
        assert not plain.ok and plain.arch == "sm_90"


def test_nvrtc_features_are_asked_of_nvrtc():
    features = nvrtc_features("sm_90")
    assert (features.version, features.supported_archs) == (nvrtc_version(), list(supported_archs()))
    assert "sm_90" in features.supported_archs
    assert (features.arch_specific_target, features.arch_specific_option) == ("sm_90a", "-arch=sm_90a")
    assert features.arch_specific_compiles and features.arch_specific_note is None
    missing = nvrtc_features("sm_80")  # no sm_80a exists: NVRTC refuses it, and the note says so
    assert not missing.arch_specific_compiles and missing.arch_specific_note


class RecordingExecutor(FakeExecutor):
    """The fake, keeping what each compile was asked and what it compiled for."""

    def __init__(self, task, compiled: list):
        super().__init__(task)
        self.compiled = compiled

    def compile(self, source, options):
        result = super().compile(source, options)
        self.compiled.append((tuple(options), result.arch, result.ok))
        return result


def test_an_attempt_keeps_its_target_and_replay_compiles_it_again(tmp_path: Path):
    run = new_run(tmp_path)
    try:
        answer = record_attempt(run, run.candidate(None, MATMUL_WGMMA, ["-arch=sm_90a"]), "wgmma", None, None)
        assert answer.verdict.startswith("valid"), answer.reasons
        finish(run, "done", None)
    finally:
        run.close()
    entry = read_json(run.dir / "history.json")["attempts"][1]
    assert entry["options"] == ["-arch=sm_90a"]
    compiled: list = []
    code = replay(run.dir, io.StringIO(), make_executor=lambda task, timing: RecordingExecutor(task, compiled), repeats=1)
    assert code == 0
    assert (("-arch=sm_90a",), "sm_90a", True) in compiled
