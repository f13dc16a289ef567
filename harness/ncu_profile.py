"""One launch of a candidate under Nsight Compute, in a one-shot confined GPU worker (profile_kernel).

The worker is the usual GPU worker program (harness/gpu_workers.py) started by `ncu`, which profiles the first
launch of the candidate's symbol and writes its raw CSV to a file of its own; the worker then runs one ordinary
run job (the candidate on one case's inputs) and exits. Nothing else runs in that worker, and no timing of
record: profiles never feed a verdict.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from harness.call_limits import OutOfTime
from harness.gpu_workers import GPU_WORKER_COMMAND
from harness.profile_digest import has_kernel
from sandbox.grants import profiled_gpu_worker_confinement
from sandbox.deadline import Deadline
from sandbox.pool import Worker, WorkerError

NCU_MISSING = "Nsight Compute (ncu) is not on this machine's PATH"
NO_PERMISSION = ("the GPU's performance counters are not available to this process (ncu: ERR_NVGPUCTRPERM); the "
                 "operator can allow them (NVreg_RestrictProfilingToAdminUsers=0) or run as root")
STOP_GRACE_S = 30.0  # ncu writes its report once the worker has exited


class ProfilingUnavailable(RuntimeError):
    """ncu or the GPU's counters cannot be used here; the message is one line."""


def ncu_path() -> str | None:
    return shutil.which("ncu")


def ncu_command(ncu: str, symbol: str, metrics: tuple[str, ...], log_file: Path) -> list[str]:
    """ncu around the GPU worker program: one launch of `symbol` (its lowered name: exact, mangled), the raw page
    as CSV in base units, into `log_file` (the worker's own stdout stays its own)."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(metrics),
            "--launch-count", "1", "--kernel-name-base", "mangled", "--kernel-name", symbol,
            "--log-file", str(log_file), *GPU_WORKER_COMMAND]


def profile_once(symbol: str, metrics: tuple[str, ...], run_once: Callable[[Worker], object], *, device: int = 0,
                 confine: bool = True, gpu_uuid: str | None = None, deadline: Deadline | None = None) -> str:
    """ncu's output for one launch: `run_once(worker)` sends a worker under ncu its one job (which starts it),
    the worker exits, and ncu's log is read. ProfilingUnavailable when ncu is missing or profiled nothing."""
    ncu = ncu_path()
    if ncu is None:
        raise ProfilingUnavailable(NCU_MISSING)
    folder = Path(tempfile.mkdtemp(prefix="kernel-referee-ncu-"))
    log_file = folder / "ncu.csv"
    worker = Worker("profile", command=ncu_command(ncu, symbol, metrics, log_file), device=device, confine=confine,
                    confinement=profiled_gpu_worker_confinement, gpu_uuid=gpu_uuid)
    try:
        try:
            run_once(worker)  # the job starts the worker, within the call's deadline
        except WorkerError as exc:
            worker.kill()
            why = _why(_read(log_file))
            if why == NO_PERMISSION:
                raise ProfilingUnavailable(why) from None
            raise ProfilingUnavailable(f"the profiled worker failed: {exc}" + (f" ({why})" if why else "")) from None
        worker.stop(grace_s=STOP_GRACE_S if deadline is None else deadline.cap(STOP_GRACE_S))
        text = _read(log_file)
        if has_kernel(text):
            return text
        if deadline is not None and deadline.expired:
            raise OutOfTime(f"the call's {deadline.seconds:g} s ran out while ncu wrote its report")
        raise ProfilingUnavailable(_why(text) or f"ncu profiled no launch of {symbol}")
    finally:
        worker.kill()
        shutil.rmtree(folder, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _why(text: str) -> str | None:
    """ncu's own reason, in one line: no permission for the counters, or its first error."""
    if "ERR_NVGPUCTRPERM" in text:
        return NO_PERMISSION
    errors = [line.strip() for line in text.splitlines() if line.startswith("==ERROR==")]
    return f"ncu: {errors[0].removeprefix('==ERROR==').strip()}" if errors else None
