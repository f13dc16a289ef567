"""The arithmetic a compiled kernel does: its CUBIN disassembled (nvdisasm) into an instruction mix.

A task says which units a kernel may compute on (task.toml's `arithmetic`, harness/arithmetic.py): a float32
GEMM emulated with bfloat16 tensor-core products passes a float32 tolerance, so only the machine code tells
which units a kernel uses. The mix counts the SASS instructions of every code section of the CUBIN (not only
the entry function's: any code in it may run), by unit: float32, float64 and half2 arithmetic on the CUDA
cores, and tensor-core MMA by input type. Counts are static (instructions in the code), not executed ones.

Parsing is pure; `disassemble` runs nvdisasm on a CUBIN. The CUBIN comes from an untrusted source, so the
disassembler runs where the compile worker runs (confined, memory-limited), with a deadline of its own.
Runs in the compile worker: imports no parent module.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

NVDISASM_DISTRIBUTION = "nvidia-cuda-nvdisasm"
DISASSEMBLE_DEADLINE_S = 10.0
# A CUBIN is at most 32 MiB (harness/compile_service.py); its listing is a few times that.
MAX_LISTING_BYTES = 512 << 20
# Tensor-core input types as the mix names them; "other" is an MMA form this parser does not know.
TENSOR_INPUTS = ("fp16", "bf16", "tf32", "fp8", "fp6", "fp4", "int8", "int4", "binary", "fp64", "other")

# One instruction line: /*0a40*/  [@!P0 ]MNEMONIC operands ;
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P(?:[0-6]|T)\s+)?([A-Z][A-Z0-9_.x]*)\s*([^;]*);")
_FP32 = frozenset({"FFMA", "FADD", "FMUL", "FFMA2", "FADD2", "FMUL2", "FFMA32I", "FADD32I", "FMUL32I"})
_FP64 = frozenset({"DFMA", "DADD", "DMUL"})
_HALF2 = frozenset({"HFMA2", "HADD2", "HMUL2", "HFMA2_32I", "HADD2_32I", "HMUL2_32I", "HFMA2.MMA"})
# ptxas materializes constants with `HFMA2.MMA Rd, -RZ, RZ, imm, imm` (0 * 0 + imm): a move, not arithmetic.
_CONSTANT_MOVE = re.compile(r"^\s*\S+\s*,\s*-RZ\s*,\s*RZ\s*,")
# Tensor-core MMA: mma.sync (HMMA, IMMA, DMMA, QMMA, BMMA, OMMA), Hopper's wgmma (HGMMA, IGMMA, QGMMA, BGMMA)
# and Blackwell's tcgen05 (UTC...MMA). HFMA2.MMA is not one: its base is HFMA2.
_TENSOR = re.compile(r"(?:UTC)?([HIDQBO])(?:G)?MMA")


class InstructionMix(BaseModel):
    """Static counts of a CUBIN's SASS instructions, by the unit that executes them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instructions: int = 0           # every instruction of every code section
    fp32: int = 0                   # float32 FFMA, FADD, FMUL (and their paired forms) on the CUDA cores
    fp64: int = 0                   # DFMA, DADD, DMUL
    half2: int = 0                  # HFMA2, HADD2, HMUL2 (constant moves written as HFMA2.MMA left out)
    tensor: dict[str, int] = {}     # tensor-core MMA instructions by input type (TENSOR_INPUTS)
    tensor_forms: list[str] = []    # the distinct tensor-core mnemonics, e.g. "HMMA.16816.F32.BF16"
    disassembler: str = ""          # nvdisasm's version

    @property
    def tensor_inputs(self) -> tuple[str, ...]:
        """The tensor-core input types the code uses, in TENSOR_INPUTS order."""
        return tuple(t for t in TENSOR_INPUTS if self.tensor.get(t))

    def forms_of(self, input_type: str) -> list[str]:
        return [form for form in self.tensor_forms if tensor_input(form) == input_type]

    def summary(self) -> str:
        """'212 instructions: 64 fp32, 0 fp64, 0 half2 on CUDA cores; tensor cores: 12 bf16 (HMMA.16816.F32.BF16)'."""
        cores = (f"{self.instructions} instructions: {self.fp32} fp32, {self.fp64} fp64, {self.half2} half2 "
                 "on CUDA cores")
        if not self.tensor:
            return f"{cores}; no tensor-core MMA"
        used = ", ".join(f"{self.tensor[t]} {t} ({', '.join(self.forms_of(t))})" for t in self.tensor_inputs)
        return f"{cores}; tensor cores: {used}"


def tensor_input(mnemonic: str) -> str | None:
    """The input type of a tensor-core MMA mnemonic ('HGMMA.64x8x16.F32.BF16' -> 'bf16'); None when the
    instruction is not a tensor-core MMA."""
    parts = mnemonic.split(".")
    found = _TENSOR.fullmatch(parts[0])
    if found is None:
        return None
    family, suffixes = found.group(1), set(parts[1:])
    if family == "D":
        return "fp64"
    if family == "H":
        return "bf16" if "BF16" in suffixes else "tf32" if "TF32" in suffixes else "fp16"
    if family == "I":
        return "int4" if suffixes & {"S4", "U4"} else "int8"
    if family == "B":
        return "binary"
    if family == "O":
        return "fp4"
    if suffixes & {"E2M1"}:                     # Q: the 8-bit-and-below float family
        return "fp4"
    if suffixes & {"E3M2", "E2M3"}:
        return "fp6"
    return "fp8"


def parse_sass(listing: str, disassembler: str = "") -> InstructionMix:
    """The mix of an nvdisasm listing (its text output)."""
    instructions = fp32 = fp64 = half2 = 0
    tensor: dict[str, int] = {}
    forms: dict[str, None] = {}
    for line in listing.splitlines():
        found = _INSTRUCTION.match(line)
        if found is None:
            continue
        mnemonic, operands = found.groups()
        instructions += 1
        base = mnemonic.split(".")[0]
        if base in _FP32:
            fp32 += 1
        elif base in _FP64:
            fp64 += 1
        elif base in _HALF2 or mnemonic in _HALF2:
            half2 += 0 if _CONSTANT_MOVE.match(operands) else 1
        elif (kind := tensor_input(mnemonic)) is not None:
            tensor[kind] = tensor.get(kind, 0) + 1
            forms[mnemonic] = None
    return InstructionMix(instructions=instructions, fp32=fp32, fp64=fp64, half2=half2,
                          tensor=dict(sorted(tensor.items(), key=lambda item: TENSOR_INPUTS.index(item[0]))),
                          tensor_forms=sorted(forms), disassembler=disassembler)


class DisassemblyFailed(RuntimeError):
    """nvdisasm is missing, ran past its deadline or failed on a CUBIN."""


@functools.cache
def nvdisasm_path() -> str:
    """The nvdisasm of the installed wheel (nvidia-cuda-nvdisasm), never a toolkit's: the version the project
    pins is the one whose listing the parser was written against."""
    try:
        files = importlib.metadata.distribution(NVDISASM_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        raise DisassemblyFailed(f"the {NVDISASM_DISTRIBUTION} package is not installed: the referee reads every "
                                "compiled kernel's instructions with its nvdisasm") from None
    for file in files:
        if file.name == "nvdisasm" and file.parent.name == "bin":
            path = os.path.realpath(file.locate())
            if os.access(path, os.X_OK):
                return path
    raise DisassemblyFailed(f"the {NVDISASM_DISTRIBUTION} package has no executable bin/nvdisasm")


def disassemble(cubin: bytes, scratch: Path, deadline_s: float = DISASSEMBLE_DEADLINE_S) -> str:
    """nvdisasm's listing of the CUBIN's code sections. The CUBIN is written into `scratch` (the compile worker's
    working folder) for the run and removed after it."""
    path = scratch / f"disassemble-{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        done = subprocess.run([nvdisasm_path(), "--print-code", "--no-dataflow", str(path)], capture_output=True,
                              timeout=deadline_s, stdin=subprocess.DEVNULL, cwd=scratch)
    except subprocess.TimeoutExpired:
        raise DisassemblyFailed(f"nvdisasm ran past its {deadline_s:g} s deadline") from None
    except OSError as exc:
        raise DisassemblyFailed(f"nvdisasm could not run: {exc}") from None
    finally:
        path.unlink(missing_ok=True)
    if done.returncode != 0:
        raise DisassemblyFailed(f"nvdisasm failed (exit status {done.returncode}): "
                                f"{done.stderr.decode(errors='replace').strip()[:500]}")
    if len(done.stdout) > MAX_LISTING_BYTES:
        raise DisassemblyFailed(f"nvdisasm's listing is {len(done.stdout)} bytes, over {MAX_LISTING_BYTES}")
    return done.stdout.decode(errors="replace")


@functools.cache
def nvdisasm_version() -> str:
    """'13.5.37': the installed wheel's version (the listing's format follows it)."""
    return importlib.metadata.version(NVDISASM_DISTRIBUTION)


def instruction_mix(cubin: bytes, scratch: Path, deadline_s: float = DISASSEMBLE_DEADLINE_S) -> InstructionMix:
    """The CUBIN's mix; DisassemblyFailed when it cannot be read."""
    return parse_sass(disassemble(cubin, scratch, deadline_s), nvdisasm_version())
