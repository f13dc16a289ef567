"""The timing protocol's settings, the compiled kernel the referee runs, and the referee's errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel

from harness.task_model import Case, LaunchSpec


class TimingSettings(BaseModel):
    warmups: int = 10
    iterations: int = 100
    rotation_sets: int = 4
    cold_l2: bool = True
    # Audited launches per job: max(min_checked_launches, checked_fraction x iterations), the same share of every
    # job's launches. record_attempt times each performance case in at least RunSettings.timing_rounds (2) jobs:
    # 2 x 10 audits, so a kernel wrong on more than half of a case's timed launches escapes them all with a
    # chance below 2**-20 (harness/audit_bound.py). Each one costs a reference launch on its inputs and a
    # comparison of its outputs, on the device where it can (device_audits).
    checked_fraction: float = 0.10
    min_checked_launches: int = 10
    # True: the audited outputs of fresh-input timings stay on the device and are compared there by the reference's
    # worker (harness/device_checks.py), whatever their size; where the outputs cannot be shared (no CUDA IPC),
    # the host compares them, as with False.
    device_audits: bool = True
    # The audited outputs one job holds on the device at most: a case whose outputs are so large that
    # checked_launches snapshots would pass it audits fewer launches per job (at least min_audits_large), and its
    # weaker bound is what the attempt records (harness/audit_bound.py).
    audit_snapshot_bytes: int = 2 << 30
    min_audits_large: int = 3
    run_deadline_s: float = 10.0
    time_deadline_s: float = 45.0
    # Noise-adaptive sampling: after the first `iterations` launches, more batches of `iterations`
    # follow until the median's 95% interval is within +-noise_target of it, or max_iterations.
    noise_target: float = 0.005
    max_iterations: int = 400
    # "kernel": each launch's own time on the GPU (CUPTI, harness/worker_side/kernel_clock.py), where the worker
    # has it, else its event pair; "events": the event pairs alone.
    clock: Literal["kernel", "events"] = "kernel"
    # True: every warm-up and timed launch draws its inputs anew on the device from a secret key, and the
    # checked launches are audited against the reference's output for their inputs (harness/worker_side/fresh_inputs.py).
    # False: launches rotate the `rotation_sets` fixed input sets (the protocol before fresh inputs; the bench
    # times both).
    fresh_inputs: bool = True
    # A check whose case has at least this many bytes of outputs is judged on the device (harness/device_checks.py):
    # no output crosses to the host. None: always on the host. Below it, the host path, whose verdicts the
    # device path matches.
    device_judging_from_bytes: int | None = 256 << 20
    # A case whose inputs take at least this many bytes has them drawn on the device from a key of its seed
    # (harness/drawn_inputs.py), where every input can be: none crosses the host. None: always made on the host.
    draw_inputs_from_bytes: int | None = 256 << 20

    @property
    def checked_launches(self) -> int:
        """How many timed launches have their output re-checked (audited, with fresh inputs)."""
        return max(self.min_checked_launches, round(self.checked_fraction * self.iterations))

    def audits_per_job(self, output_bytes: int) -> int:
        """checked_launches, fewer where their snapshots of `output_bytes` each would pass audit_snapshot_bytes."""
        fitting = self.audit_snapshot_bytes // max(output_bytes, 1)
        return max(min(self.checked_launches, fitting), min(self.min_audits_large, self.checked_launches))


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled kernel ready to run: CUBIN, its symbol, and how to launch it."""

    label: str
    cubin: bytes
    symbol: str
    launch: LaunchSpec


class ReferenceFailed(RuntimeError):
    """The task's reference kernel failed: the task, not a candidate, is broken. Says the case and why, on one
    line (server/cli_errors.py, server/app.py)."""

    def __init__(self, case: str, reason: str):
        super().__init__(case, reason)
        self.case, self.reason = case, " ".join(str(reason).split())

    def __str__(self) -> str:
        return f"the task's reference kernel failed on case {self.case}: {self.reason}"


class Unavailable(RuntimeError):
    """The worker cannot do this job: an optional library (cuBLAS) does not load there."""


def input_seed(case: Case, set_index: int, base_seed: int | None = None) -> int:
    """Set 0 uses the case's seed (or a fresh one); the rotation sets derive theirs from it."""
    seed = case.seed if base_seed is None else base_seed
    if set_index == 0:
        return seed
    return int(np.random.SeedSequence([seed, 0x5EED, set_index]).generate_state(1, np.uint64)[0] >> 1)

