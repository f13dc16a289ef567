"""The task's independent host oracle (numpy, float64), loaded from the task folder.

The task folder is written by the user, like the reference: its code is trusted, unlike candidates.
"""

from __future__ import annotations

import types

import numpy as np

from harness.task_model import Task


class OracleError(RuntimeError):
    """The task's oracle could not be loaded or returned something unusable."""


def run_oracle(task: Task, dims: dict[str, int], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if task.oracle_file is None:
        raise OracleError(f"task {task.name} declares no oracle")
    path = task.root / task.oracle_file
    # Compiled from its text, never imported: an import writes __pycache__/ into the task folder, which a
    # run's lock would then see as an added file (root is not stopped by the read-only copy).
    module = types.ModuleType(f"kernel_referee_oracle_{task.name}")
    module.__file__ = str(path)
    try:
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the task's own trusted code
    except (OSError, SyntaxError) as exc:
        raise OracleError(f"{path}: cannot be loaded as a Python module: {exc}") from None
    if not callable(getattr(module, "oracle", None)):
        raise OracleError(f"{path}: defines no function oracle(inputs, dims)")
    result = module.oracle({k: v.copy() for k, v in inputs.items()}, dict(dims))
    shapes = task.shapes(dims)
    outputs = {}
    for param in task.output_params:
        if param.name not in result:
            raise OracleError(f"{path}: oracle returned no '{param.name}'")
        array = np.asarray(result[param.name], dtype=np.float64)
        if array.shape != tuple(shapes[param.name]):
            raise OracleError(f"{path}: '{param.name}' has shape {array.shape}, expected {tuple(shapes[param.name])}")
        outputs[param.name] = array
    return outputs
