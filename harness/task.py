"""Loading a task: ``load_task`` reads a folder's ``task.toml``, checks it whole and returns its
:class:`~harness.task_model.Task`; ``make_inputs`` draws a case's inputs for a seed.

``load_task`` refuses any manifest it cannot use and says where: every problem becomes a
:class:`TaskError` carrying the file, a field path in the TOML (``params[2].shape[0]``,
``inputs.a.low``) and what is wrong, so a task author can fix a manifest without reading this code.
The models are in :mod:`harness.task_model`, the checks in :mod:`harness.task_checks`, the C
signature parser in :mod:`harness.csig` and the input generators in :mod:`harness.inputs`; the
format is documented in docs/task-format.md.
"""

from __future__ import annotations

import tomllib
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from harness import task_checks
from harness.arithmetic import CUDA_CORES, Arithmetic
from harness.inputs import draw
from harness.task_schema_errors import field_path, schema_error
from harness.task_model import (_STRICT, WHOLE_FILE, Case, Cost, Generator, LaunchSpec, Param, PlainNumber, Task,
                                TaskError, Tolerance, Vendor)

# -------------------------------------------------------------------- inputs

def make_inputs(task: Task, dims: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs for (task, dims, seed); each input gets its own stream."""
    shapes = task.shapes(dims)

    def one(param) -> np.ndarray:
        # keying the stream by name keeps an input's values stable when others are added
        entropy = [seed, zlib.crc32(param.name.encode())]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        return np.ascontiguousarray(draw(task, param, shapes[param.name], rng))

    params = list(task.input_params)
    elements = sum(int(np.prod(shapes[p.name], dtype=np.int64)) for p in params)
    if len(params) < 2 or elements < (1 << 20):
        return {p.name: one(p) for p in params}
    # Each input has its own stream, and numpy draws without the GIL: large inputs are made side by side.
    with ThreadPoolExecutor(max_workers=min(len(params), 8), thread_name_prefix="inputs") as pool:
        return dict(zip((p.name for p in params), pool.map(one, params)))


# ------------------------------------------------------------------- loading

class _Kernel(BaseModel):
    model_config = _STRICT
    name: str
    signature: str
    reference: str = "reference.cu"
    initial: str = "initial.cu"


class _ManifestCase(Case):
    """A case as written: its own dimensions are integers (the task's constants join them in :class:`Task`)."""

    dims: dict[str, int]


class _Manifest(BaseModel):
    """task.toml as written; :class:`Task` is the flattened form the referee uses."""

    model_config = _STRICT
    name: str
    description: str
    oracle: str | None = None
    kernel: _Kernel
    params: list[Param]
    inputs: dict[str, Generator] = {}
    tolerance: dict[str, Tolerance] = {}
    launch: LaunchSpec
    reference_launch: LaunchSpec | None = None
    initial_launch: LaunchSpec | None = None
    cost: Cost = Cost()
    arithmetic: Arithmetic = CUDA_CORES
    vendor: Vendor | None = None
    constants: dict[str, PlainNumber] = {}
    device_heap: bool = False
    cases: list[_ManifestCase]


def load_task(path: str | Path) -> Task:
    """Load and fully check the task in folder ``path`` (or at ``path`` = its task.toml)."""
    path = Path(path)
    file = path if path.suffix == ".toml" and not path.is_dir() else path / "task.toml"
    file = file.resolve()
    data = _read_toml(file)
    try:
        manifest = _Manifest.model_validate(data)
    except ValidationError as err:
        raise schema_error(file, err, _Manifest) from None
    task = Task(
        root=file.parent, name=manifest.name, description=manifest.description,
        kernel_name=manifest.kernel.name, signature=manifest.kernel.signature,
        reference_file=manifest.kernel.reference, initial_file=manifest.kernel.initial,
        oracle_file=manifest.oracle, params=tuple(manifest.params), inputs=manifest.inputs,
        tolerances=manifest.tolerance, launch=manifest.launch,
        reference_launch=manifest.reference_launch, initial_launch=manifest.initial_launch,
        cost=manifest.cost, arithmetic=manifest.arithmetic, vendor=manifest.vendor, constants=manifest.constants,
        device_heap=manifest.device_heap,
        cases=_with_constants(manifest, file),
    )
    task_checks.check_task(task, file)
    return task


def _with_constants(manifest: _Manifest, file: Path) -> tuple[Case, ...]:
    """Each case with the task's constants beside its own dims; a case may not set a constant."""
    cases = []
    for i, case in enumerate(manifest.cases):
        for name in case.dims:
            if name in manifest.constants:
                raise TaskError(file, field_path(("cases", i, "dims", name)), f"{name!r} is a task constant "
                                f"([constants] {name} = {manifest.constants[name]!r}); a case cannot set it")
        cases.append(Case(name=case.name, role=case.role, dims={**case.dims, **manifest.constants}, seed=case.seed))
    return tuple(cases)


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise TaskError(file, WHOLE_FILE, "not found; a task folder must contain task.toml") from None
    except OSError as err:
        raise TaskError(file, WHOLE_FILE, f"cannot read: {err.strerror or err}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise TaskError(file, WHOLE_FILE, f"not valid UTF-8 (byte {err.start})") from None
    except tomllib.TOMLDecodeError as err:
        raise TaskError(file, WHOLE_FILE, f"invalid TOML: {err}") from None

