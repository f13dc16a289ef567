"""Making a run and resuming one: the folder, the expected outputs and the lock; then the baseline
(attempt 0) for a new run, or the settling of attempts a stopped server left open for a resumed one.

Run's constructor only holds state: what is recorded when a run begins or comes back happens here.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Callable

from harness.footprint import machine_shortfalls, shortfalls
from harness.task import load_task
from harness.task_model import Task
from server import keys, lock as locking
from server.attempt import record_baseline, settle_interrupted
from server.audit import LOG_NAME
from server.call import part
from server.executor import Executor
from server.folder_lock import FolderHeld, FolderLock
from server.lease_waits import name_lease
from server.log_head import HEAD_NAME, KEEPS_HEAD
from server.records import EventKind
from server.report_files import report_cut_short, write_end_report
from server.expected_files import load_expected, write_expected
from server.run import Progress, Run, RunError, RunSettings, TaskDoesNotFit, now_iso
from server.signed_log import run_key
from server.verify import chain_break, end_break, signature_break

PREPARING = ".preparing-"  # a new run's folder until it is prepared and renamed to run-NNN
# The share of a new run's preparation done once its GPU workers started, and once its expected outputs are written.
START_SHARE, EXPECTED_END = 0.1, 0.5


def new_run(task_dir: Path, results: Path, settings: RunSettings, executor: Executor,
            progress: Progress | None = None) -> Run:
    """A new run under `results`, prepared in this thread: `begin_new_run`, then `prepare_new_run`."""
    run = begin_new_run(task_dir, results, settings, executor)
    prepare_new_run(run, results, progress)
    return run


def begin_new_run(task_dir: Path, results: Path, settings: RunSettings, executor: Executor) -> Run:
    """A new run, not yet prepared, in a folder of its own under `results` that is no run folder yet
    (`.preparing-*`): the task's copy, held by this process. Quick: what takes long is `prepare_new_run`'s."""
    task = load_task(task_dir)  # refuse a broken task, or one too large for this machine, before making a folder
    problems = machine_shortfalls(task, settings.timing, results, settings.keep_expected)
    if problems:
        raise TaskDoesNotFit("the task does not fit on this machine: " + "; ".join(problems))
    if settings.key_dir is not None:
        _key_or_refuse(keys.check_key_dir, settings.key_dir)
    results.mkdir(parents=True, exist_ok=True)
    _sweep_preparations(results)
    run_dir, folder = _preparing_folder(results)
    try:
        shutil.copytree(task_dir, run_dir / "task", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _make_read_only(run_dir / "task")
        key = _key_or_refuse(keys.create_key, run_dir, settings.key_dir)
        run = Run(run_dir, load_task(run_dir / "task"), settings, executor, {}, key=key)
    except BaseException:
        folder.release()
        _remove(run_dir)
        raise
    run.folder_lock = folder
    return run


def prepare_new_run(run: Run, results: Path, progress: Progress | None = None,
                    check_first: Callable[[Task], None] | None = None) -> None:
    """Run `check_first` on the run's task (it raises to refuse it), start the GPU side, check the task fits the device, record
    the run's creation, its expected outputs, its lock and its baseline, then move its folder into place as
    results/run-NNN (one rename: a run folder is never half made). On failure, or when the process is killed
    meanwhile, no run folder is left."""
    try:
        if check_first is not None:
            _told(progress, "checking that the task's reference and initial kernels compile")
            check_first(run.task)
            _told(progress, "starting the GPU workers")
        environment = run.executor.start()
        problems = shortfalls(run.task, run.settings.timing, environment)
        if problems:
            raise TaskDoesNotFit("the task does not fit on this machine: " + "; ".join(problems))
        run.environment = environment
        if progress:
            progress(START_SHARE, 1.0, "GPU workers started")
        _begin(run, environment, progress)
        _move_into_place(run, results)
    except BaseException:
        _discard(run)
        raise


def _told(progress: Progress | None, step: str) -> None:
    if progress:
        progress(0.0, 1.0, step)


def _begin(run: Run, environment: dict, progress: Progress | None) -> None:
    """What a new run records before its first call: its creation, the expected outputs, the lock, the baseline."""
    settings = run.settings.model_dump(mode="json")
    run.audit.append(EventKind.RUN_CREATED, {"task": run.task.name, "settings": settings, **_device(environment),
                                             "signing_key": run.key.anchor(), KEEPS_HEAD: HEAD_NAME})
    run.write_json("run.json", {"task": run.task.name, "created": now_iso(), "settings": settings})
    _write_expected(run, part(progress, START_SHARE, EXPECTED_END, 1.0))
    run.lock_record = locking.make_lock(run.dir, environment, run.key.anchor())
    run.write_json("lock.json", run.lock_record)
    record_baseline(run, part(progress, EXPECTED_END, 1.0, 1.0))


def _discard(run: Run) -> None:
    """A new run that failed before it was moved into place (a reference that fails, a full disk, an interrupt)
    is no run: nothing was attempted, no resume would take it, so its folder goes rather than stay half made."""
    run.close()  # its audit log, and its hold on the folder
    if run.key is not None and run.settings.key_dir is not None:  # the key of no run
        keys.key_path(run.dir, run.settings.key_dir, run.key.fingerprint).unlink(missing_ok=True)
    _remove(run.dir)


def _remove(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # the task copy is read-only
        if path.is_dir() and not path.is_symlink():
            path.chmod(stat.S_IRWXU)
    folder.chmod(stat.S_IRWXU)
    shutil.rmtree(folder, ignore_errors=True)


def _preparing_folder(results: Path) -> tuple[Path, FolderLock]:
    """A new `.preparing-*` folder under `results`, held by this process. Another server's sweep may take and
    remove it between its mkdir and its lock: then another name is tried."""
    for _ in range(3):
        run_dir = results / f"{PREPARING}{os.getpid()}-{secrets.token_hex(4)}"
        run_dir.mkdir()
        try:
            return run_dir, FolderLock.take(run_dir, "serve")
        except (FolderHeld, FileNotFoundError):
            continue
    raise RunError(f"no folder for a new run could be made and held under {results}")


def _sweep_preparations(results: Path) -> None:
    """Remove what a start killed during its preparation left (a `.preparing-*` folder no process holds): no
    run, and nothing any command reads."""
    for folder in results.glob(f"{PREPARING}*"):
        try:
            held = FolderLock.take(folder, "sweep")
        except (RunError, OSError):
            continue  # another server is preparing it, or it is already gone
        held.release()
        _remove(folder)


def _move_into_place(run: Run, results: Path) -> None:
    """Rename the prepared folder to the next free results/run-NNN. The number is claimed by an empty folder
    (mkdir), which the rename then replaces: a run folder appears whole, its log, lock and history in it."""
    final = _next_run_dir(results)
    with run.folder_moving():
        os.rename(run.dir, final)
        run.dir = final
    run.task = load_task(final / "task")  # a task reads its sources from its folder
    run.audit.moved_to(final)  # its open file moved with the folder
    run.lock_record = run.lock_record  # the locked files, checked under the new folder
    run.folder_lock.run_dir = final  # its lock file, held, moved with the folder too
    name_lease(run.executor, final.name)


def resume_run(run_dir: Path, executor: Executor, folder: FolderLock | None = None) -> Run:
    """The run in `run_dir`, checked against its lock and its audit chain, held by this process (`folder`, or
    taken here: FolderHeld if another holds it); attempts a stopped server left open are recorded as
    interrupted (a run that spent its budget that way finishes, and its report is written)."""
    if folder is None and not (run_dir / "lock.json").is_file():
        raise RunError(f"{run_dir} holds no run to resume (no lock.json)")
    folder = folder or FolderLock.take(run_dir, "serve")
    try:
        lock_record, environment = _checked_for_resume(run_dir, executor)
        key = _key_or_refuse(run_key, run_dir)  # None: a run made before signing goes on unsigned
        run = Run(run_dir, load_task(run_dir / "task"), RunSettings.of_run(run_dir), executor, environment, key=key)
    except BaseException:
        folder.release()
        raise
    run.folder_lock = folder
    name_lease(executor, run_dir.name)
    try:
        differences = locking.environment_changes(lock_record, environment)
        if any(d.startswith(("gpu:", "gpu_uuid:", "compute_capability:")) for d in differences):
            raise RunError(f"{run_dir.name} began on another GPU: {'; '.join(differences)}")
        run.audit.append(EventKind.RUN_RESUMED, {"environment_changes": differences, **_device(environment)})
        _preload_expected(run)
        run.load_state()
    except BaseException:
        run.close()  # its audit log is open
        raise
    was_finished = run.finished
    settle_interrupted(run)  # a run whose budget these attempts spent finishes here, its report due
    if was_finished and report_cut_short(run.dir, run.key):
        run.report_due = True  # a stop came between the run's end and its report's signature
    write_end_report(run)
    return run


def _device(environment: dict) -> dict:
    """The GPU a run began or resumed on, for its history: index (nvidia-smi's) and UUID, where known."""
    return {"gpu_index": environment.get("gpu_index"), "gpu_uuid": environment.get("gpu_uuid")}


def _checked_for_resume(run_dir: Path, executor: Executor) -> tuple[dict, dict]:
    """(lock.json, the environment now) of a run that may be resumed: its chain holds, its files are those
    it locked, the referee's code is the one that began it. Nothing is written before these hold."""
    broken = chain_break(run_dir / LOG_NAME) or signature_break(run_dir) or end_break(run_dir)
    if broken:
        raise RunError(f"{run_dir.name} cannot be resumed: its audit log does not verify (first broken record: "
                       f"{broken}); `kernel-referee verify {run_dir}` lists every problem")
    lock_record = locking.read_lock(run_dir)
    problems = locking.tampered_files(run_dir, lock_record)
    if problems:
        raise RunError(f"{run_dir} was tampered with: {'; '.join(problems)}")
    changed = locking.referee_changes(lock_record)
    if changed:
        raise RunError(f"the referee's code changed since {run_dir.name} began ({', '.join(changed[:5])}); "
                       "judge it with the version that started it")
    return lock_record, executor.start()


def _key_or_refuse(step, *args):
    """A step of the run's signing key (server/keys.py), its failure a RunError that serve prints on one line."""
    try:
        return step(*args)
    except keys.SigningKeyError as e:
        raise RunError(str(e)) from e


def _write_expected(run: Run, progress: Progress | None) -> None:
    sets = run.settings.timing.rotation_sets
    kinds = write_expected(run.dir, run.task, sets, run.executor, run.settings.keep_expected, progress)
    stored = {"cases": [c.name for c in run.task.cases], "sets": sets}
    if any(kind != "files" for kind in kinds.values()):
        stored["sha256_tree_only"] = sorted(name for name, kind in kinds.items() if kind != "files")
    run.audit.append(EventKind.EXPECTED_OUTPUTS_WRITTEN, stored)


def _preload_expected(run: Run) -> None:
    load_expected(run.dir, run.task, run.settings.timing.rotation_sets, run.executor)


def _next_run_dir(results: Path) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[4:]) for p in results.glob("run-[0-9][0-9][0-9]*") if p.name[4:].isdigit()]
    number = max(taken, default=0) + 1
    while True:
        candidate = results / f"run-{number:03d}"
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1


def _make_read_only(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | (stat.S_IXUSR | stat.S_IXGRP if path.is_dir() else 0))
    root.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
