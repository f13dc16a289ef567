"""What the run's NVRTC offers a candidate on this device, asked of NVRTC itself rather than assumed: its
version, the real architectures it compiles for (nvrtcGetSupportedArchs), and whether the device's
architecture-specific target (sm_90a on a 9.0 device: wgmma, TMA bulk copies, setmaxnreg) compiles, found by
compiling a one-line kernel for it the way a candidate's `-arch=sm_90a` is compiled."""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel

from harness.worker_side.compile_policy import CompileResult, arch_specific, arch_specific_option
from harness.worker_side.nvrtc import compile_kernel, nvrtc_version, supported_archs

PROBE_KERNEL = "referee_arch_probe"
PROBE_SOURCE = f'extern "C" __global__ void {PROBE_KERNEL}(int* x) {{ x[0] = 1; }}'

# compiler(source, kernel_name, options, arch): CompileService.compile, or compile_directly.
Compile = Callable[[str, str, tuple[str, ...], str], CompileResult]


class NvrtcFeatures(BaseModel):
    version: str                      # e.g. "13.0"
    supported_archs: list[str]        # the real architectures this NVRTC compiles for
    arch: str                         # what a candidate is compiled for unless it asks otherwise, e.g. "sm_90"
    arch_specific_target: str         # this device's architecture-specific target, e.g. "sm_90a"
    arch_specific_option: str         # the compile option that asks for it, e.g. "-arch=sm_90a"
    arch_specific_compiles: bool      # a kernel compiled for it here
    arch_specific_note: str | None = None  # why it did not, where it did not


def compile_directly(source: str, kernel_name: str, options: tuple[str, ...], arch: str) -> CompileResult:
    """NVRTC in this process: for the referee's own probe kernel only, never a candidate's source."""
    return compile_kernel(source, kernel_name, options=options, arch=arch)


def nvrtc_features(arch: str, compiler: Compile = compile_directly) -> NvrtcFeatures:
    """The features of the NVRTC that compiles candidates for a device of architecture `arch` (e.g. "sm_90")."""
    option = arch_specific_option(arch)
    probe = compiler(PROBE_SOURCE, PROBE_KERNEL, (option,), arch)
    note = None if probe.ok else (probe.log.strip().splitlines() or ["no compiler log"])[0][:300]
    return NvrtcFeatures(version=nvrtc_version(), supported_archs=list(supported_archs()), arch=arch,
                         arch_specific_target=arch_specific(arch), arch_specific_option=option,
                         arch_specific_compiles=probe.ok, arch_specific_note=note)
