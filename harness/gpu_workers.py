"""The GPU worker program, and the pool of two (reference, candidate) that the referee uses."""

from __future__ import annotations

import sys

from sandbox.pool import WorkerPool

# harness/worker_side/gpu_worker_main.py: one CUDA context, confined before it loads CUDA.
GPU_WORKER_COMMAND = (sys.executable, "-m", "harness.worker_side.gpu_worker_main")


def gpu_worker_pool(gpu_uuid: str | None = None, confine: bool = True) -> WorkerPool:
    """Two workers on the GPU named by `gpu_uuid` (the only one they see, their device 0); None: the one
    CUDA numbers 0 (a host with one GPU, or no NVML to name them)."""
    return WorkerPool(GPU_WORKER_COMMAND, device=0, confine=confine, gpu_uuid=gpu_uuid)
