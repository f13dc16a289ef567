"""Is there a usable NVIDIA GPU here, and if not, why not (in words a user can act on).

The question is asked in a short-lived child process, so that the parent never loads the driver
and owns no CUDA state that a sticky error could break.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading

_PROBE = "import json, harness.device as d; print(json.dumps({'absent': d.probe_in_this_process()}))"
_started: subprocess.Popen | None = None  # the probe start_probe began, answered by gpu_absent_reason


def start_probe() -> None:
    """Begin the probe now and take its answer later: a command that checks for a GPU right after importing its
    modules (serve, demo) starts it first, so that the child's driver start runs while the parent imports. NVML's
    own start (the list of GPUs the command reads next: harness/gpus.py) begins too, in a thread of this process
    (NVML's calls release the GIL)."""
    global _started
    if _started is None:
        _started = _probe()
        threading.Thread(target=_start_nvml, name="nvml-start", daemon=True).start()


def _start_nvml() -> None:
    try:
        import pynvml  # optional, as in harness/gpus.py
        pynvml.nvmlInit()  # counted: the later list's own nvmlInit then finds it started
    except Exception:  # noqa: BLE001 - without NVML the command lists no GPU, as it would have anyway
        pass


def _probe() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


@functools.cache
def gpu_absent_reason() -> str | None:
    """None when a CUDA device is usable; otherwise the reason, e.g. no driver library."""
    global _started
    child, _started = _started or _probe(), None
    try:
        stdout, stderr = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return "the CUDA driver did not answer within 120 s"
    try:
        return json.loads(stdout.strip().splitlines()[-1])["absent"]
    except (IndexError, ValueError, KeyError):
        return f"the GPU probe failed: {stderr.strip()[-500:] or 'no output'}"


def probe_in_this_process() -> str | None:
    try:
        from cuda.bindings import driver  # an absent or broken install is this probe's answer
    except ImportError as exc:  # pragma: no cover - a broken install
        return f"cuda-bindings is not importable: {exc}"
    try:
        result = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError and friends
        return f"no NVIDIA driver library (libcuda) on this machine ({type(exc).__name__})"
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed: {result[0].name}"
    error, count = driver.cuDeviceGetCount()
    if error != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "the NVIDIA driver reports no CUDA device"
    return None
