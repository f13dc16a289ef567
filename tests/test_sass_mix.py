"""harness/worker_side/sass_mix.py: kernels compiled by the real NVRTC for sm_90 / sm_90a, disassembled by the real
nvdisasm, read into instruction mixes; the parser on listing lines; the disassembler inside the confined compile
worker (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.compile_service import CompileService
from harness.worker_side.compile_policy import arch_specific_option
from harness.worker_side.executable_files import startup_files
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.sass_mix import (DisassemblyFailed, disassemble, instruction_mix, nvdisasm_path, parse_sass,
                                          tensor_input)
from sandbox.confine import unavailable_reason

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures" / "sass"
WGMMA = TESTS / "gpu" / "kernels" / "wgmma_bf16.cu"
SM90A = (arch_specific_option("sm_90"),)

# (source, kernel, options, the unit counted, the tensor-core forms seen)
KERNELS = [
    (FIXTURES / "ffma_loop.cu", "ffma_loop", (), "fp32", []),
    (FIXTURES / "double_loop.cu", "double_loop", (), "fp64", []),
    (FIXTURES / "half2_loop.cu", "half2_loop", (), "half2", []),
    (FIXTURES / "wmma_fp16.cu", "wmma_fp16", (), "fp16", ["HMMA.16816.F32"]),
    (FIXTURES / "mma_bf16.cu", "mma_bf16", (), "bf16", ["HMMA.16816.F32.BF16"]),
    (FIXTURES / "mma_tf32.cu", "mma_tf32", (), "tf32", ["HMMA.1688.F32.TF32"]),
    (FIXTURES / "mma_int8.cu", "mma_int8", (), "int8", ["IMMA.16832.S8.S8"]),
    (FIXTURES / "mma_fp64.cu", "mma_fp64", (), "fp64", ["DMMA.8x8x4"]),
    (FIXTURES / "mma_fp8.cu", "mma_fp8", SM90A, "fp8", ["QGMMA.64x8x32.F32.E4M3.E4M3"]),
    (WGMMA, "matmul_bf16", SM90A, "bf16", ["HGMMA.64x8x16.F32.BF16"]),
]


@pytest.mark.parametrize("path, kernel, options, unit, forms", KERNELS, ids=[k[1] + "-" + k[3] for k in KERNELS])
def test_each_fixture_reads_as_the_unit_it_uses(tmp_path, path, kernel, options, unit, forms):
    compiled = compile_kernel(path.read_text(), kernel, options=options, arch="sm_90")
    assert compiled.ok, compiled.log
    mix = instruction_mix(compiled.cubin, tmp_path)
    assert mix.instructions > 10
    assert mix.tensor_forms == forms
    if forms:
        assert mix.tensor_inputs == (unit,)
        assert mix.tensor[unit] >= 1
        assert mix.fp32 == mix.fp64 == mix.half2 == 0  # these fixtures do their arithmetic on the tensor cores only
    else:
        assert mix.tensor == {}
        assert getattr(mix, unit) >= 64  # the loop's 64 operations, unrolled
        assert [u for u in ("fp32", "fp64", "half2") if getattr(mix, u)] == [unit]
    assert mix.disassembler and list(tmp_path.iterdir()) == []  # the CUBIN written for nvdisasm is removed


LISTING = """
        /*0070*/               @P0 EXIT ;
        /*0080*/                   FFMA R3, R2, R2, 1 ;
        /*0090*/              @!P1 FADD.FTZ R4, R3, -R2 ;
        /*00a0*/                   FMUL R4, R4, 0.5 ;
        /*00b0*/                   HFMA2.MMA R8, -RZ, RZ, 0, 0 ;
        /*00c0*/                   HFMA2.MMA R3, R3, R2, 3, 3 ;
        /*00d0*/                   HADD2 R3, R3, R2 ;
        /*00e0*/             @!UPT DMUL R6, R4, R6 ;
        /*00f0*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24, gsb0 ;
        /*0100*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24, gsb0 ;
        /*0110*/                   HMMA.16816.F16 R12, R4, R10, RZ ;
        // a comment: /*0120*/ HMMA.1688.F32.TF32 R1, R2, R3, RZ ;
.L_x_1:
        /*0130*/                   NOP;
"""


def test_the_parser_counts_units_and_leaves_out_constant_moves():
    mix = parse_sass(LISTING, "13.5.37")
    assert (mix.instructions, mix.fp32, mix.fp64, mix.half2) == (12, 3, 1, 2)
    assert mix.tensor == {"fp16": 1, "bf16": 2}
    assert mix.tensor_forms == ["HGMMA.64x128x16.F32.BF16", "HMMA.16816.F16"]
    assert "2 bf16 (HGMMA.64x128x16.F32.BF16)" in mix.summary()


@pytest.mark.parametrize("mnemonic, expected", [
    ("HMMA.16816.F32", "fp16"), ("HMMA.16816.F32.BF16", "bf16"), ("HMMA.1684.F32.TF32", "tf32"),
    ("HGMMA.64x8x16.F32", "fp16"), ("HGMMA.64x64x8.F32.TF32", "tf32"), ("IGMMA.64x8x32.S32.S8.S8", "int8"),
    ("IMMA.8832.S4.S4", "int4"), ("QMMA.16832.F32.E4M3.E4M3", "fp8"), ("QGMMA.64x8x32.F32.E5M2.E5M2", "fp8"),
    ("DMMA.8x8x4", "fp64"), ("BMMA.88128.AND.POPC", "binary"), ("UTCHMMA.2CTA", "fp16"), ("UTCQMMA", "fp8"),
    ("OMMA.16864.F32.E2M1", "fp4"),
    ("HFMA2.MMA", None), ("FFMA", None), ("WARPGROUP.ARRIVE", None), ("HMNMX2", None),
])
def test_tensor_input_of_each_mma_form(mnemonic, expected):
    assert tensor_input(mnemonic) == expected


def test_a_cubin_the_disassembler_cannot_read_fails(tmp_path):
    with pytest.raises(DisassemblyFailed, match="nvdisasm failed"):
        disassemble(b"\x7fELF" + b"\x00" * 200, tmp_path)
    compiled = compile_kernel((FIXTURES / "ffma_loop.cu").read_text(), "ffma_loop")
    with pytest.raises(DisassemblyFailed, match="deadline"):
        disassemble(compiled.cubin, tmp_path, deadline_s=0.001)
    assert list(tmp_path.iterdir()) == []


def test_the_disassembler_needs_only_its_own_files():
    files = startup_files(nvdisasm_path())
    assert files[0] == nvdisasm_path() and len(files) >= 3  # the program, its loader, libc at least
    assert any(Path(f).name.startswith("libc.so") for f in files)


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"needs Landlock: {unavailable_reason()}")
def test_the_confined_compile_worker_answers_with_the_mix():
    with CompileService(confine=True) as service:
        bf16 = service.compile((FIXTURES / "mma_bf16.cu").read_text(), "mma_bf16", (), "sm_90")
        wgmma = service.compile(WGMMA.read_text(), "matmul_bf16", SM90A, "sm_90")
        plain = service.compile((FIXTURES / "ffma_loop.cu").read_text(), "ffma_loop", (), "sm_90")
        assert service.worker.alive
    assert bf16.ok and bf16.mix.tensor_forms == ["HMMA.16816.F32.BF16"]
    assert wgmma.ok and wgmma.mix.tensor == {"bf16": 1}
    assert plain.ok and plain.mix.tensor == {} and plain.mix.fp32 >= 64
