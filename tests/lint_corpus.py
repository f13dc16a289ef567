"""Small tasks for lint's corpora, made from one line of a table each: the arrays, the inputs' distributions,
the oracle's body, the tolerances and the cases. Each becomes a folder (task.toml, reference.cu, initial.cu,
oracle.py) as a person would write it; lint judges a task by its oracle, so the kernels only need to compile
with the signature's name (they copy nothing and compute nothing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.csig import C_TYPES

NORMAL = 'kind = "normal"\nstd = 1.0'
UNIFORM = 'kind = "uniform"\nlow = -1.0\nhigh = 1.0'


@dataclass(frozen=True)
class Spec:
    """`arrays`: "name:in|out:dtype:dim,dim" each; `inputs`: each input's generator lines (default NORMAL);
    `oracle`: the body of oracle(inputs, dims), with np, the inputs by name and the dims by name in scope,
    ending in the outputs' dict; `tolerance`: (rtol, atol) of every output; `cases`: "role:dim=v,dim=v"
    each (seeds 1, 2, ... in order, unless "@seed" ends the entry)."""

    name: str
    arrays: str
    oracle: str
    tolerance: tuple[float, float]
    cases: tuple[str, ...]
    inputs: dict[str, str] = field(default_factory=dict)


def _arrays(spec: Spec) -> list[tuple[str, str, str, list[str]]]:
    return [(n, k, d, s.split(",")) for n, k, d, s in (a.split(":") for a in spec.arrays.split())]


def _dims(spec: Spec) -> list[str]:
    names: list[str] = []
    for _, _, _, shape in _arrays(spec):
        names += [d for d in shape if d not in names]
    return names


def _signature(spec: Spec) -> str:
    params = [f"{'const ' if kind == 'in' else ''}{C_TYPES[dtype]}* {name}" for name, kind, dtype, _ in _arrays(spec)]
    params += [f"int {d}" for d in _dims(spec)]
    return f'extern "C" __global__ void {spec.name}({", ".join(params)})'


def _toml(spec: Spec) -> str:
    lines = [f'name = "{spec.name}"', f'description = "{spec.name}, a lint corpus task"', 'oracle = "oracle.py"',
             "", "[kernel]", f'name = "{spec.name}"', f"signature = '{_signature(spec)}'"]
    for name, kind, dtype, shape in _arrays(spec):
        kind = "input" if kind == "in" else "output"
        lines += ["", "[[params]]", f'name = "{name}"', f'kind = "{kind}"', f'dtype = "{dtype}"',
                  f"shape = {shape!r}".replace("'", '"')]
    for d in _dims(spec):
        lines += ["", "[[params]]", f'name = "{d}"', 'kind = "scalar"', 'dtype = "int32"', f'value = "{d}"']
    for name, kind, _, _ in _arrays(spec):
        if kind == "in":
            lines += ["", f"[inputs.{name}]", spec.inputs.get(name, NORMAL)]
        else:
            lines += ["", f"[tolerance.{name}]", f"rtol = {spec.tolerance[0]!r}", f"atol = {spec.tolerance[1]!r}"]
    lines += ["", "[launch]", "grid = [1]", "block = [32]"]
    for i, entry in enumerate(spec.cases, 1):
        role, _, rest = entry.partition(":")
        rest, _, seed = rest.partition("@")
        dims = ", ".join(f"{k} = {v}" for k, v in (kv.split("=") for kv in rest.split(",")))
        lines += ["", "[[cases]]", f'name = "{role}-{i}"', f'role = "{role}"', f"dims = {{ {dims} }}",
                  f"seed = {seed or i}"]
    return "\n".join(lines) + "\n"


def _oracle(spec: Spec) -> str:
    inputs = [n for n, k, _, _ in _arrays(spec) if k == "in"]
    body = [f"    {n} = inputs[{n!r}].astype(np.float64)" for n in inputs]
    body += [f"    {d} = dims[{d!r}]" for d in _dims(spec)]
    body += [f"    {line}" for line in spec.oracle.strip().splitlines()]
    return "import numpy as np\n\n\ndef oracle(inputs, dims):  # noqa: F841\n" + "\n".join(body) + "\n"


def write_task(spec: Spec, parent: Path) -> Path:
    folder = parent / spec.name
    folder.mkdir()
    (folder / "task.toml").write_text(_toml(spec))
    headers = {"float16": "#include <cuda_fp16.h>\n", "bfloat16": "#include <cuda_bf16.h>\n"}
    kernel = "".join(sorted({headers[d] for _, _, d, _ in _arrays(spec) if d in headers})) + _signature(spec) + " {}\n"
    (folder / "reference.cu").write_text(kernel)
    (folder / "initial.cu").write_text(kernel)
    (folder / "oracle.py").write_text(_oracle(spec))
    return folder
