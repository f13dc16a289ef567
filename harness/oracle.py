"""The task's independent host oracle (numpy, float64), loaded from the task folder.

The task folder is written by the user, like the reference: its code is trusted, unlike candidates.
Its interface (docs/task-format.md, "The oracle"): `oracle(inputs, dims) -> {output name: array}`,
with the case's input arrays (copies) and its dims (constants included); scalars are not passed.

Trusted is not sound: an oracle that calls sys.exit() or never returns would end lint, check or serve without a
word, or block them forever. So it is loaded and called in a thread with a deadline: an exit is an OracleError
like any failure, and an oracle past its deadline is one too. Such a thread cannot be killed; it is a daemon,
ended with the process (lint and check stop there; serve refuses the task at its start), and the same oracle is
not started again in this process. What it prints goes to stderr.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.task_model import Task

# A call's deadline: a minute, and a microsecond for each element of its inputs (numpy's float64 work runs at
# hundreds of elements per microsecond: the allowance is for an oracle in plain Python loops, or a GEMM's cube).
ORACLE_BASE_DEADLINE_S = 60.0
ORACLE_DEADLINE_S_PER_ELEMENT = 1e-6
_hung: set[str] = set()   # the oracle files of this process that passed their deadline


class OracleError(RuntimeError):
    """The task's oracle could not be loaded, failed, or returned something unusable: the task is broken."""


@dataclass(frozen=True)
class OutputSummary:
    """What the oracle returned for one output, as `kernel-referee check` prints it without a GPU."""

    name: str
    shape: tuple[int, ...]
    dtype: str            # as the oracle returned it (the referee compares in float64)
    nan: int
    inf: int
    low: float | None     # the smallest and largest finite values; None when none is finite
    high: float | None

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0


def run_oracle(task: Task, dims: dict[str, int], inputs: dict[str, np.ndarray],
               case: str | None = None) -> dict[str, np.ndarray]:
    """The oracle's outputs for one case, in float64, checked for presence and shape."""
    returned = _returned(task, dims, inputs, case)
    outputs = {}
    for name, array in returned.items():
        try:
            outputs[name] = np.asarray(array, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise OracleError(f"{_file(task)}: '{name}'{_on(case)} is not numeric: {exc}") from None
    return outputs


def summarize(task: Task, dims: dict[str, int], inputs: dict[str, np.ndarray], case: str) -> list[OutputSummary]:
    """Shape, dtype, non-finite counts and range of each output the oracle returns for one case."""
    summaries = []
    for name, returned in _returned(task, dims, inputs, case).items():
        array = np.asarray(returned)
        try:
            values = array.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise OracleError(f"{_file(task)}: '{name}'{_on(case)} is not numeric: {exc}") from None
        finite = values[np.isfinite(values)]
        summaries.append(OutputSummary(
            name=name, shape=tuple(values.shape), dtype=str(array.dtype), nan=int(np.isnan(values).sum()),
            inf=int(np.isinf(values).sum()), low=float(finite.min()) if finite.size else None,
            high=float(finite.max()) if finite.size else None))
    return summaries


def oracle_deadline_s(inputs: dict[str, np.ndarray]) -> float:
    """How long one call of the oracle may take on these inputs."""
    return ORACLE_BASE_DEADLINE_S + ORACLE_DEADLINE_S_PER_ELEMENT * sum(int(v.size) for v in inputs.values())


def _returned(task: Task, dims: dict[str, int], inputs: dict[str, np.ndarray], case: str | None) -> dict:
    path = _file(task)
    copies = {k: v.copy() for k, v in inputs.items()}
    result = _within_deadline(path, case, oracle_deadline_s(inputs), lambda: _load(task)(copies, dict(dims)))
    if not isinstance(result, dict):
        raise OracleError(f"{path}: oracle returned {type(result).__name__}{_on(case)}, not a dict of output arrays")
    shapes = task.shapes(dims)
    outputs = {}
    for param in task.output_params:
        if param.name not in result:
            raise OracleError(f"{path}: oracle returned no '{param.name}'{_on(case)}")
        shape = np.shape(result[param.name])
        if shape != tuple(shapes[param.name]):
            raise OracleError(f"{path}: '{param.name}' has shape {shape}{_on(case)}, expected "
                              f"{tuple(shapes[param.name])}")
        outputs[param.name] = result[param.name]
    return outputs


def _within_deadline(path: Path, case: str | None, deadline_s: float, call):
    """`call()`'s value, run in a daemon thread; an OracleError for whatever it raised (an exit included) or for
    not returning within `deadline_s`."""
    if str(path) in _hung:
        raise OracleError(f"{path} did not return within its deadline earlier in this process: not called again")
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the task's code must not end the process
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"oracle {path.parent.name}", daemon=True)
    # What the oracle prints goes to stderr: stdout carries the report of lint and check, one line per finding.
    with contextlib.redirect_stdout(sys.stderr):
        thread.start()
        thread.join(deadline_s)
    if thread.is_alive():
        _hung.add(str(path))
        raise OracleError(f"{path} did not return within {deadline_s:g} s{_on(case)} (the oracle's deadline): "
                          "a loop that never ends, or work far beyond the case's size")
    exc = box.get("error")
    if exc is None:
        return box["value"]
    if isinstance(exc, OracleError):
        raise exc
    if isinstance(exc, SystemExit):
        raise OracleError(f"{path} called sys.exit({exc.code!r}){_on(case)}{_where(exc, path)}: an oracle "
                          "returns its outputs, it never ends the process")
    # the task's own code failed: said on one line, with where
    raise OracleError(f"{path} failed{_on(case)}: {type(exc).__name__}: {exc}{_where(exc, path)}")


def _load(task: Task):
    if task.oracle_file is None:
        raise OracleError(f"task {task.name} declares no oracle")
    path = _file(task)
    # Compiled from its text, never imported: an import writes __pycache__/ into the task folder, which a
    # run's lock would then see as an added file (root is not stopped by the read-only copy).
    module = types.ModuleType(f"kernel_referee_oracle_{task.name}")
    module.__file__ = str(path)
    try:
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the task's own trusted code
    except (OSError, SyntaxError) as exc:
        raise OracleError(f"{path}: cannot be loaded as a Python module: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - its module-level code failed
        raise OracleError(f"{path}: failed while loading: {type(exc).__name__}: {exc}{_where(exc, path)}") from None
    if not callable(getattr(module, "oracle", None)):
        raise OracleError(f"{path}: defines no function oracle(inputs, dims)")
    return module.oracle


def _file(task: Task) -> Path:
    return task.root / (task.oracle_file or "oracle.py")


def _on(case: str | None) -> str:
    return f" on case {case}" if case else ""


def _where(exc: BaseException, path: Path) -> str:
    """` (line N)` of the oracle's own frame nearest to where it raised, if any."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(path)]
    return f" (line {lines[-1]})" if lines else ""
