"""`kernel-referee serve` and `kernel-referee verify`: start or resume a run and serve it over MCP."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Callable, TextIO

from harness.device import gpu_absent_reason
from harness.gpus import Placement, list_gpus, placement_for
from harness.lint import refuse_uncompilable
from harness.placement import GpuInfo, PlacementError, parse_choice
from harness.settings import TimingSettings
from harness.task import load_task
from harness.task_model import Task
from server import transport
from server.app import build_server
from server.audit import sha256_file
from server.verify import verify_run
from server.executor import Executor, GpuExecutor
from server.folder_lock import EXIT_HELD, FolderHeld, FolderLock
from server.lifecycle import begin_new_run, resume_run
from server.preparation import prepare_behind
from server.lock import locked_gpu_uuid
from server.log_head import HEAD_NAME
from server.record_files import HISTORY, SUMMARY, read_summary
from server.run import Run, RunError, RunSettings, TaskDoesNotFit
from server.settings import RefereeSettings, sandbox_refusal

log = logging.getLogger(__name__)
EXIT_NO_GPU = 3
# How long a server whose client left waits for a preparation it stopped to remove its folder (a folder left
# behind is removed by the next start: server/lifecycle.py `_sweep_preparations`).
STOP_WAIT_S = 30.0
MakeExecutor = Callable[[Task, TimingSettings, GpuInfo | None], Executor]


def serve(settings: RefereeSettings, task_dir: Path | None, run_dir: Path | None, start_new: bool = False,
          gpu: str | None = None) -> int:
    """Start a run of the task in `task_dir` (or resume the unfinished one of the same task, unless
    `start_new`), or resume `run_dir`, and serve it until the client leaves; on GPU `gpu` (an index or a
    UUID), else on a free one (harness/placement.py).

    Over HTTP the token and the port come first: a bad token or a busy port (transport.PortInUse) is refused
    before the GPU is looked for or a run is made, and the port stays held until the server serves on it."""
    if settings.transport != "http":
        return _serve(settings, task_dir, run_dir, start_new, gpu, None, None)
    credentials = transport.resolve_token()
    with transport.listen(settings.host, settings.port) as listener:
        return _serve(settings, task_dir, run_dir, start_new, gpu, credentials, listener)


def _serve(settings: RefereeSettings, task_dir: Path | None, run_dir: Path | None, start_new: bool, gpu: str | None,
           credentials: tuple[str, bool] | None, listener: socket.socket | None) -> int:
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"kernel-referee serve needs an NVIDIA GPU: {absent}. `kernel-referee check TASK` compiles "
              "kernels without one.", file=sys.stderr)
        return EXIT_NO_GPU
    refusal = sandbox_refusal(settings.confine)
    if refusal:
        print(f"kernel-referee: {refusal}", file=sys.stderr)
        return 2
    token, generated = credentials or (None, False)

    def make_executor(task: Task, timing: TimingSettings, placed: GpuInfo | None) -> Executor:
        return GpuExecutor(task, timing, confine=settings.confine, compile_deadline_s=settings.compile_deadline_s,
                           gpu=placed)

    def served(run: Run) -> None:
        options = transport.http_auth(token, settings.host, settings.port) if settings.transport == "http" else {}
        transport.run(build_server(run, **options), settings.transport, host=settings.host, port=settings.port,
                      token=token, token_generated=generated, listener=listener)

    return serve_run(settings.results, settings.run, task_dir, run_dir, start_new, make_executor, served,
                     list_gpus(), gpu, check_first=refuse_uncompilable)  # lint's compiles (server/cli.py _serve)


def serve_run(results: Path, run_settings: RunSettings, task_dir: Path | None, run_dir: Path | None, start_new: bool,
              make_executor: MakeExecutor, served: Callable[[Run], None], gpus: list[GpuInfo] | None = None,
              gpu: str | None = None, check_first: Callable[[Task], None] | None = None) -> int:
    """Open the run (`serve`'s rules) on its GPU, hold its folder while `served(run)` serves it; the exit status.
    A new run's preparation runs `check_first` on its task first (it raises to refuse the task).

    A run folder another process holds is refused (EXIT_HELD); with `--task`, a newest unfinished run that
    is held is left to its server and a new run starts instead. `gpus`: the host's (harness/gpus.py); a
    resumed run goes back on its own GPU unless `gpu` names one, and a GPU not on the host is refused."""
    try:
        wanted = parse_choice(gpu) if gpu is not None else None
        if wanted is not None and not gpus:
            placement_for([], wanted, "serve")  # refuses: no GPU can be named
    except PlacementError as exc:
        print(f"kernel-referee: {exc}", file=sys.stderr)
        return 2
    folder, placement = None, None
    if run_dir is None and not start_new:
        run_dir, folder = _unfinished_run_to_resume(results, task_dir)
    placement = None
    try:
        placement = _placement(gpus or [], wanted, run_dir)
        try:
            run = open_run(results, run_settings, task_dir, run_dir, make_executor, folder,
                           placement.gpu if placement else None, check_first)
        except BaseException:
            if placement is not None:
                placement.release()  # no run on it: the GPU is free for another server
            raise
    except PlacementError as exc:
        if folder is not None:
            folder.release()
        print(f"kernel-referee: {exc}", file=sys.stderr)
        return 2
    except FolderHeld as held:
        print(f"kernel-referee: {held}", file=sys.stderr)
        return EXIT_HELD
    except RunError as exc:
        hint = (" (or pass --new-run to start a new run of this task)"
                if task_dir is not None and not isinstance(exc, TaskDoesNotFit) else "")
        print(f"kernel-referee: {exc}{hint}", file=sys.stderr)
        return 2
    try:
        if run.preparation is None:
            _say_run(run)
        served(run)
    finally:
        failed = run.preparation is not None and run.preparation.failed  # before the client left
        _stop(run)
        if placement is not None:
            placement.release()
    return 2 if failed else 0


def _say_run(run: Run) -> None:
    _say(f"run folder: {run.dir} (attempts used {run.attempts_used} of {run.settings.max_attempts})")
    if run.key is not None:  # the anchor a person keeps outside the folder
        _say(f"signing key fingerprint: {run.key.fingerprint} "
             f"(keep it: `kernel-referee verify {run.dir} --public-key {run.key.fingerprint}`)")


def _stop(run: Run) -> None:
    """The server's end: a preparation still running is stopped (its workers closed under it) and its folder
    removed, as a new run that failed; then the run's folder is let go."""
    preparation = run.preparation
    stopped = preparation is not None and not preparation.wait(0)
    if stopped:
        preparation.stopping()
        run.executor.abort()
    run.executor.close()
    if stopped:
        preparation.wait(STOP_WAIT_S)
        _say("the client left before the run was prepared: " + (
            f"it was ready meanwhile ({run.dir})" if preparation.ready else "stopped; no run was made"))
    run.close()


def _placement(gpus: list[GpuInfo], wanted: int | str | None, run_dir: Path | None) -> Placement | None:
    """The run's GPU and this server's claim on it (held until the process ends); None without NVML (one GPU,
    as CUDA numbers it). A resumed run goes back on the GPU it began on, where that one is here (elsewhere,
    resume_run refuses it)."""
    placement = placement_for(gpus, wanted, f"serve {run_dir.name if run_dir else 'new run'}",
                              locked_gpu_uuid(run_dir) if run_dir is not None else None)
    if placement is not None and len(gpus) > 1:  # one GPU: as before, nothing to say
        _say(f"on {placement.gpu.describe()}" + (", shared with another run served there" if placement.shared else ""))
    return placement


def _unfinished_run_to_resume(results: Path, task_dir: Path) -> tuple[Path | None, FolderLock | None]:
    """The newest unfinished run of this task, held by this process; (None, None) if there is none or another
    process holds it (then a new run starts, and this says so)."""
    run_dir = latest_unfinished_run(results, task_dir)
    if run_dir is None:
        return None, None
    try:
        folder = FolderLock.take(run_dir, "serve")
    except FolderHeld as held:
        _say(f"{held}: starting a new run of this task instead")
        return None, None
    _say(f"resuming {run_dir}: an unfinished run of this same task (--new-run starts another)")
    return run_dir, folder


def open_run(results: Path, run_settings: RunSettings, task_dir: Path | None, run_dir: Path | None,
             make_executor: MakeExecutor, folder: FolderLock | None = None, gpu: GpuInfo | None = None,
             check_first: Callable[[Task], None] | None = None) -> Run:
    """A new run of `task_dir` under `results` (run_dir None), or `run_dir` resumed with its own settings;
    its folder held by this process (`folder` when already taken). Raises RunError (FolderHeld among them)."""
    try:
        task = load_task(task_dir if run_dir is None else run_dir / "task")
        # a resumed run keeps its own budget and protocol
        settings = run_settings if run_dir is None else RunSettings.of_run(run_dir)
        executor = make_executor(task, settings.timing, gpu)
    except BaseException:
        if folder is not None:
            folder.release()
        raise
    try:
        if run_dir is None:
            run = begin_new_run(task_dir, results, settings, executor)
            _say(f"preparing a run of {task.name} behind the server: reference outputs and the baseline "
                 "(attempt 0); its tools answer once it is ready")
            prepare_behind(run, results, _say, _say_run, check_first)
            return run
        return resume_run(run_dir, executor, folder)
    except BaseException:
        executor.close()
        raise


def _task_files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def latest_unfinished_run(results: Path, task_dir: Path) -> Path | None:
    """The newest run under `results` of this very task (same files) that has not finished.

    A client that restarts its server with the same `serve --task` command must get the same run
    back, budget included, not a fresh one.
    """
    wanted = _task_files(task_dir)
    for run_dir in sorted(results.glob("run-[0-9][0-9][0-9]*"), reverse=True):
        if not (run_dir / HISTORY).exists() or not (run_dir / "task").is_dir():
            continue
        if (run_dir / SUMMARY).exists() and read_summary(run_dir).finished:
            continue
        if _task_files(run_dir / "task") == wanted:
            return run_dir
    return None


# verify: the folder holds together, but its log was made before signing (anyone could remake it), or signed before
# its end was pinned (records cut from the end of an unfinished run would not be seen)
EXIT_UNSIGNED = 5


def verify(run_dir: Path, out: TextIO, public_key: str | None = None) -> int:
    """The command's report goes to `out` (the terminal); it is not part of any MCP stream."""
    report = verify_run(run_dir, public_key=public_key)
    if report.ok and report.signed and report.end_pinned:
        print(f"{run_dir}: ok ({report.records} records, chain head {report.head}, signed by key "
              f"{report.fingerprint})", file=out)
        return 0
    if report.ok and report.signed:
        print(f"{run_dir}: end not pinned (signed before the log kept its signed head, {HEAD_NAME}): the chain, "
              f"signatures and files hold ({report.records} records, chain head {report.head}, signed by key "
              f"{report.fingerprint}), but records cut from the end of an unfinished run would not be seen", file=out)
        return EXIT_UNSIGNED
    if report.ok:
        print(f"{run_dir}: unsigned (made before signing): the chain and files hold ({report.records} records, "
              f"chain head {report.head}), but anyone could have recomputed the chain", file=out)
        return EXIT_UNSIGNED
    where = f" (first broken record: events.jsonl line {report.first_broken_line})" if report.first_broken_line else ""
    print(f"{run_dir}: FAILED{where}", file=out)
    for problem in report.problems:
        print(f"  {problem}", file=out)
    return 1


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
