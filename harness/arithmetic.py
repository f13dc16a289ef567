"""The arithmetic a task allows, judged from a kernel's SASS instruction mix (harness/worker_side/sass_mix.py).

A float32 GEMM emulated with bfloat16 tensor-core products (each float split into a high and a low half,
three products a term, float32 accumulation) meets a float32 tolerance and every audit, yet it is another
kind of kernel: it races against the tensor cores' peak, not the CUDA cores'. So a task names the units a
kernel may compute on (task.toml's `arithmetic`, docs/task-format.md):

- "cuda-cores": the CUDA cores only (float32, float64, half2 or integer instructions); no tensor-core MMA of
  any input type. The default: a task that does not say is held to the units every kernel has.
- "any": the CUDA cores and the tensor cores, of every input type.
- a list of tensor-core input types, e.g. ["bf16"]: the CUDA cores and tensor-core MMA with those inputs only.

A kernel whose mix breaks its task's rule is rejected (`arithmetic_not_allowed`) before it is timed (before
it runs, except in record_attempt, which checks a new compile while its instructions are read); the
reference and the initial kernel are the task author's and are not held to it. The mix also chooses the
compute peak a timed case is held to (`compute_kind`): the tensor-core peak of the fastest input type the
kernel uses, else the CUDA cores' float32 peak (half2's where it uses half2 arithmetic).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator

from harness.results import Reason, ReasonCode
from harness.worker_side.sass_mix import InstructionMix

TensorInput = Literal["fp16", "bf16", "tf32", "fp8", "fp6", "fp4", "int8", "int4", "binary", "fp64"]
CUDA_CORES = "cuda-cores"
ANY = "any"


def _as_tuple(value):
    # TOML gives a list; a task is frozen, so the allowed types are a tuple.
    return tuple(value) if isinstance(value, list) else value


Arithmetic = Union[Literal["cuda-cores", "any"], Annotated[tuple[TensorInput, ...], BeforeValidator(_as_tuple)]]

# Compute kinds a timed case can be held to (harness/peaks.py), by tensor-core input type; the order is the
# speed order on every architecture that has them (fp8 and int8 twice bf16 and fp16, twice tf32; fp64 last).
TENSOR_KINDS = {"fp4": "tensor_fp8", "fp6": "tensor_fp8", "fp8": "tensor_fp8", "int4": "tensor_int8",
                "int8": "tensor_int8", "binary": "tensor_int8", "fp16": "tensor_fp16", "bf16": "tensor_bf16",
                "tf32": "tensor_tf32", "fp64": "tensor_fp64"}
# A form the parser does not know ("other") is held to the fastest tensor-core peak there is.
_FASTEST_FIRST = ("fp4", "fp6", "fp8", "int4", "int8", "binary", "other", "fp16", "bf16", "tf32", "fp64")


def allowed_inputs(arithmetic: Arithmetic) -> tuple[str, ...] | None:
    """The tensor-core input types a task allows; None: every one."""
    if arithmetic == ANY:
        return None
    return () if arithmetic == CUDA_CORES else tuple(arithmetic)


def describe(arithmetic: Arithmetic) -> str:
    """'CUDA cores only', 'CUDA cores and tensor cores of any input type', 'CUDA cores and bf16 tensor cores'."""
    allowed = allowed_inputs(arithmetic)
    if allowed is None:
        return "CUDA cores and tensor cores of any input type"
    return "CUDA cores only" if not allowed else f"CUDA cores and {', '.join(allowed)} tensor cores"


def arithmetic_reason(arithmetic: Arithmetic, mix: InstructionMix | None) -> Reason | None:
    """Why a kernel with this mix breaks the task's rule (`arithmetic_not_allowed`, naming the instructions),
    or None. A kernel whose instructions were not read (no mix) breaks any rule narrower than "any"."""
    allowed = allowed_inputs(arithmetic)
    if allowed is None:
        return None
    if mix is None:
        return Reason(code=ReasonCode.ARITHMETIC_NOT_ALLOWED,
                      detail=f"the task allows {describe(arithmetic)} (task.toml `arithmetic`), and this kernel's "
                             "instructions were not read")
    forbidden = [t for t in mix.tensor_inputs if t not in allowed]
    if not forbidden:
        return None
    used = "; ".join(f"{mix.tensor[t]} {t} tensor-core MMA ({', '.join(mix.forms_of(t))})" for t in forbidden)
    return Reason(code=ReasonCode.ARITHMETIC_NOT_ALLOWED,
                  detail=f"the kernel's SASS holds {used}; the task allows {describe(arithmetic)} (task.toml "
                         "`arithmetic`): compute on the allowed units")


def compute_kind(mix: InstructionMix | None, declared: str = "fp32") -> str:
    """The compute peak (harness/peaks.py's kind) a timed case of a kernel with this mix is held to: the tensor
    cores' of the fastest input type it uses; else half2's where it does half2 arithmetic, else the CUDA cores'
    float32. Without a mix (a record older than the mix), the task's declared `cost.compute`."""
    if mix is None:
        return declared
    used = mix.tensor_inputs
    for input_type in _FASTEST_FIRST:
        if input_type in used:
            return TENSOR_KINDS.get(input_type, "tensor_any")
    return "half2" if mix.half2 else "fp32"


def arithmetic_problem(arithmetic: Arithmetic, declared_compute: str) -> str | None:
    """What is wrong with a task's `arithmetic` beside its `cost.compute` (harness/task_checks.py), or None."""
    if isinstance(arithmetic, tuple):
        if not arithmetic:
            return 'an empty list allows no tensor cores: write "cuda-cores"'
        if len(set(arithmetic)) != len(arithmetic):
            return f"{list(arithmetic)} names an input type twice"
    if declared_compute.startswith("tensor_") and not allowed_inputs(arithmetic) and arithmetic != ANY:
        return (f'"cuda-cores" forbids the tensor cores that cost.compute = "{declared_compute}" bounds the roofline '
                'with: allow them (e.g. arithmetic = ["bf16"]) or bound it with "fp32"')
    return None
