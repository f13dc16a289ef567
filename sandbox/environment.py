"""The environment a worker starts with: only what Python and CUDA need, no secrets."""

from __future__ import annotations

import os
from pathlib import Path

# Names a worker may inherit. Tokens, API keys and credentials never match these. VIRTUAL_ENV is
# not among them: Python finds its venv from pyvenv.cfg beside the interpreter, and the variable
# only tells a worker where the parent's files are.
_KEEP = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
         "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def worker_environment(scratch: Path, gpu_uuid: str | None = None) -> dict[str, str]:
    """`gpu_uuid`: the only GPU the worker sees (CUDA_VISIBLE_DEVICES), its device 0; None: the inherited view."""
    env = {name: os.environ[name] for name in _KEEP if name in os.environ}
    if gpu_uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               CUDA_CACHE_DISABLE="1",
               # Imports come from the install only: not from the worker's cwd (its writable scratch,
               # which `python -m` would put first on sys.path) nor from a user site folder.
               PYTHONSAFEPATH="1", PYTHONNOUSERSITE="1")
    return env
