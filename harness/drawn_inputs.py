"""Large cases' inputs, drawn on the device: a case whose inputs take at least
TimingSettings.draw_inputs_from_bytes has each input drawn where it is used, by the referee's generator
(harness/worker_side/fresh_inputs.py), from a key derived from the input seed, instead of being made on the host
and sent through the pipe. The reference's worker and the candidates' draw the same values; the parent makes
them on the host only for the float64 oracle (draw_on_host: bit for bit for uniform and integers, within an
ulp on rare elements for normal).

A case's own seed is public, and so are its drawn inputs; a secret seed's key is as secret as the seed.
"""

from __future__ import annotations

import hashlib

import numpy as np

from harness.task_model import DTYPES, Case, Task
from harness.worker_side import fresh_inputs


def case_draws(task: Task, case: Case, from_bytes: int | None) -> dict[str, dict] | None:
    """How each input of the case is drawn on the device, where its inputs are that large and every one of them
    can be drawn there; else None (the host makes them)."""
    if from_bytes is None:
        return None
    nbytes = task.nbytes(case.dims)
    if sum(nbytes[p.name] for p in task.input_params) < from_bytes:
        return None
    draws = {}
    for p in task.input_params:
        generator = task.inputs[p.name]
        if generator.kind not in fresh_inputs.DISTRIBUTIONS or p.dtype not in fresh_inputs.DTYPE_CODES:
            return None
        draws[p.name] = fresh_inputs.draw_spec(generator.kind, p.dtype, generator.low, generator.high,
                                               generator.mean, generator.std)
    return draws


def oracle_cases(task: Task, cases, settings) -> list[Case]:
    """Those of `cases` the float64 oracle takes on the host: not the large ones, whose inputs are drawn on the
    device (the oracle would need every array in float64 in host memory)."""
    return [case for case in cases if case_draws(task, case, settings.draw_inputs_from_bytes) is None]


def oracle_split(task: Task, cases, settings) -> tuple[list[Case], list[str]]:
    """Those of `cases` the float64 oracle takes on the host, and the names of those it skips (too large)."""
    taken = oracle_cases(task, cases, settings)
    return taken, [case.name for case in cases if case not in taken]


def draw_key(seed: int) -> int:
    """The generator key of an input seed's draws."""
    digest = hashlib.blake2b(seed.to_bytes(8, "little"), person=b"kr-inputs", digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def host_draws(task: Task, case: Case, seed: int, draws: dict[str, dict]) -> dict[str, np.ndarray]:
    """The inputs the device draws for this seed, made on the host (for the oracle)."""
    shapes = task.shapes(case.dims)
    key = fresh_inputs.launch_key(draw_key(seed), 0)
    arrays = {}
    for stream, p in enumerate(task.input_params):
        shape = shapes[p.name]
        words = fresh_inputs.draw_on_host(draws[p.name], int(np.prod(shape, dtype=np.int64)), key, stream)
        arrays[p.name] = words.view(DTYPES[p.dtype]).reshape(shape)
    return arrays
