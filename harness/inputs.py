"""Filling one input array: a draw from its generator, or a pinned .npy file.

:func:`harness.task.make_inputs` gives each input its own random stream and
calls :func:`draw`; :func:`read_npy` is also how ``load_task`` checks a .npy.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from harness.task_model import DTYPES, Param, Task, TaskError


def draw(task: Task, param: Param, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The values of input ``param`` at ``shape``, from its generator and ``rng``."""
    gen = task.inputs[param.name]
    dtype = DTYPES[param.dtype]
    if gen.kind == "uniform":
        return rng.uniform(gen.low, gen.high, shape).astype(dtype)
    if gen.kind == "normal":
        mean = 0.0 if gen.mean is None else gen.mean
        return rng.normal(mean, gen.std, shape).astype(dtype)
    if gen.kind == "integers":
        return rng.integers(gen.low, gen.high, shape, dtype=np.int64).astype(dtype)
    assert gen.file is not None and gen.sha256 is not None
    return read_npy(task.root / "task.toml", f"inputs.{param.name}", task.root / gen.file,
                    gen.sha256, dtype, shape)


def read_npy(file: Path, field: str, path: Path, sha256: str, dtype: np.dtype,
             shape: tuple[int, ...]) -> np.ndarray:
    """Load a pinned .npy; the hash is checked again in case the file changed since load.

    Problems are :class:`TaskError`s against manifest ``file`` at ``field`` (``inputs.NAME``).
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise TaskError(file, f"{field}.file", f"cannot read {path}: {err.strerror or err}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256.lower():
        raise TaskError(file, f"{field}.sha256",
                        f"does not match {path.name} (its SHA-256 is {digest})")
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise TaskError(file, f"{field}.file", f"{path.name} is not a readable .npy: {err}") from None
    if not isinstance(array, np.ndarray):
        raise TaskError(file, f"{field}.file", f"{path.name} is not a single .npy array")
    if array.dtype.kind == "V" and dtype.kind == "V" and array.dtype.itemsize == dtype.itemsize:
        # .npy has no code for ml_dtypes types; bfloat16 arrays come back as raw 2-byte voids
        array = array.view(dtype)
    if array.dtype != dtype:
        raise TaskError(file, f"{field}.file", f"{path.name} holds {array.dtype}, expected {dtype.name}")
    if array.shape != shape:
        raise TaskError(file, f"{field}.file", f"{path.name} has shape {array.shape}, expected {shape}")
    return array
