"""The GPU worker program, and the pool of two (reference, candidate) that the referee uses."""

from __future__ import annotations

import sys

from sandbox.pool import WorkerPool

# harness/worker_side/gpu_worker_main.py: one CUDA context, confined before it loads CUDA.
GPU_WORKER_COMMAND = (sys.executable, "-m", "harness.worker_side.gpu_worker_main")


def gpu_worker_pool(device: int = 0, confine: bool = True) -> WorkerPool:
    return WorkerPool(GPU_WORKER_COMMAND, device=device, confine=confine)
