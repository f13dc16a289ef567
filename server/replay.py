"""`kernel-referee replay RUN`: a run's best kernel (or one attempt) again, on this GPU, judged afresh.

The run folder is verified first; one that does not verify is refused (exit 2). Then, with the
run's own task copy, locked expected outputs and timing protocol: the kernel's compiled instructions against
the task's `arithmetic` (an "arithmetic" check, failed before any run, as a run refuses it), the kernel on each replay request
(best-case-N.json), on the holdout cases against the reference outputs and against the float64
oracle, and on fresh random values against the oracle; then N interleaved timings beside the
baseline (attempts/000.cu), each against the device's physical limit (a re-timed kernel beyond it fails a
"physical-limit" check). server/decision.py says GO or NO-GO. The result goes to RUN/replay.json
(RUN/replay-attempt-NNN.json for --attempt), a file the audit log does not record: appending to
events.jsonl could break the chain of a server still holding the run (docs/decisions.md).
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, TextIO

from harness.device import gpu_absent_reason
from harness.gpus import list_gpus, placement_for
from harness.oracle import OracleError
from harness.settings import CompiledKernel, ReferenceFailed, TimingSettings
from harness.side_by_side import TimingFailed, time_side_by_side
from harness.stats import geomean_speedup, significance, speedup
from harness.task_model import Task
from harness.worker_side.sass_mix import InstructionMix
from server import lock as locking
from server import suspicion
from server.audit import write_json_atomic
from server.verify import verify_run
from server.decision import (CheckResult, Decision, RepeatResult, decide, environment_differences,
                             other_environment_differences)
from server.executor import Executor, GpuExecutor
from server.folder_lock import EXIT_HELD, FolderHeld, FolderLock
from server.replay_checks import compile_subject, correctness_checks
from server.replay_record import RunFolderError, RunRecord, load_record
from server.keys import SigningKeyError
from server.report_files import REPORT_NAME, write_report_files
from server.signed_log import sign_derived
from server.expected_files import load_expected
from server.run import now_iso

log = logging.getLogger(__name__)
EXIT_GO, EXIT_NO_GO, EXIT_BAD_RUN, EXIT_NO_GPU = 0, 1, 2, 3
MakeExecutor = Callable[[Task, TimingSettings], Executor]
Say = Callable[[str], None]


# -- the replay -------------------------------------------------------------------------------

def replay_run(record: RunRecord, make_executor: MakeExecutor, repeats: int = 3, chain_head: str | None = None,
               say: Say | None = None) -> dict:
    """Check and time the record's kernel on a fresh executor; the replay.json document, decision included.

    A failure inside the referee (a worker that cannot start, a reference that fails) ends the replay
    as a failed check named "referee": what was measured before it is kept, and the decision is NO-GO.
    """
    say = say or (lambda message: None)
    checks: list[CheckResult] = []
    timings: list[tuple[RepeatResult, dict]] = []
    env_now: dict = {}
    executor: Executor | None = None
    waits: list = []  # waits for the GPU's lease (harness/gpu_lease.py): another process was timing on it
    try:
        executor = make_executor(record.task, record.settings.timing)
        with _no_bytecode():
            env_now = executor.start()
            if (lease := getattr(executor, "gpu_lease", None)) is not None:
                lease.listener, waits = say, lease.waits
            _preload(executor, record)
            _replay(executor, record, repeats, say, checks, timings, env_now)
    except Exception as exc:  # noqa: BLE001 - reported as the replay's failure, and logged
        # The task's reference or oracle failing is said in one line; anything else comes with its traceback.
        log.warning("the replay could not complete: %s", exc, exc_info=not isinstance(exc, (ReferenceFailed, OracleError)))
        checks.append(CheckResult(name="referee", kind="referee", passed=False, reasons=[
            f"the replay could not complete: {type(exc).__name__}: {exc}"[:1000]]))
    finally:
        if executor is not None:
            executor.close()
    env_run = record.lock.get("environment") or {}
    decision = decide(checks, [r for r, _ in timings], env_run, env_now)
    return {**_document(record, repeats, chain_head, checks, timings, env_run, env_now, decision),
            "gpu_lease_waits": [w.model_dump(mode="json") for w in waits]}


@contextmanager
def _no_bytecode():
    """The oracle is imported from the run's task copy: run as root, Python would add a __pycache__ to the
    locked, read-only folder, and a resumed run would then refuse it as tampered."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def _preload(executor: Executor, record: RunRecord) -> None:
    """The run's locked reference outputs (or the sha256-trees they must hash to): the replay judges against
    what the run judged against."""
    load_expected(record.dir, record.task, record.settings.timing.rotation_sets, executor)


def _replay(executor: Executor, record: RunRecord, repeats: int, say: Say, checks: list[CheckResult],
            timings: list[tuple[RepeatResult, dict]], environment: dict | None = None) -> None:
    kernel, failed = compile_subject(executor, record.kernel, record.task)  # held to the task's arithmetic
    baseline, baseline_failed = compile_subject(executor, record.baseline)
    checks += [c for c in (failed, baseline_failed) if c is not None]
    if kernel is None or baseline is None:
        return
    mix = executor.compile(record.kernel.source, record.kernel.options).mix  # a cache hit: the units it computes on
    say(f"attempt {record.kernel.attempt} on its visible cases")
    checks += correctness_checks(executor, record.task, kernel, record.requests, record.settings.timing, say)
    for number in range(1, repeats + 1):
        say(f"timing beside the baseline, repeat {number} of {repeats}")
        timings.append(_repeat(executor, record, kernel, baseline, number))
        checks += _physical_limit(record, environment or {}, timings[-1], mix)


def _repeat(executor: Executor, record: RunRecord, kernel: CompiledKernel, baseline: CompiledKernel,
            number: int) -> tuple[RepeatResult, dict]:
    """One interleaved timing (the run's rounds), the speedup over the baseline per case and overall."""
    cases = list(record.task.performance_cases)
    if not cases:
        return RepeatResult(repeat=number, reasons=["the task has no performance cases"]), {}
    try:
        timed = time_side_by_side(executor.time, {"candidate": kernel, "baseline": baseline}, cases,
                                  record.settings.timing_rounds,
                                  judged=("candidate",) if record.kernel.attempt > 0 else ())  # as in the run
    except TimingFailed as failed:
        why = "; ".join(f"{r.code.value} [{r.case}]: {r.detail}" for r in failed.reasons)
        return RepeatResult(repeat=number, reasons=[f"the {failed.label} failed its timing: {why}"]), {}
    stats = timed.stats()
    pairs = {c.name: (stats["baseline"][c.name], stats["candidate"][c.name]) for c in cases}
    result = RepeatResult(repeat=number, speedup=geomean_speedup(list(pairs.values())),
                          cases={name: speedup(*pair) for name, pair in pairs.items()})
    extra = {"stats": {label: {case: s.model_dump(mode="json") for case, s in per_case.items()}
                       for label, per_case in stats.items()},
             "samples_ms": timed.samples}
    if timed.waived:  # the yardsticks' timings taken as measured, their shape reasons kept (as in history.json)
        extra["shape_waived"] = timed.waived
    return result, extra


def _physical_limit(record: RunRecord, environment: dict, timed: tuple[RepeatResult, dict],
                    mix: InstructionMix | None = None) -> list[CheckResult]:
    """The re-timed kernel's medians against this device's physical limits (server/suspicion.py): a failed
    check per case beyond them, so the decision is NO-GO naming beyond_physical_limit. The numbers go into the
    repeat's record. The baseline (attempt 0) is the task's own kernel: exempt, as in the run."""
    result, extra = timed
    stats = (extra.get("stats") or {}).get("candidate")
    if record.kernel.attempt == 0 or not stats:
        return []
    checks = suspicion.physical_limit_checks(record.task, environment, stats, mix)
    if checks:
        extra["physical_limit"] = suspicion.limit_record(checks)
    return [CheckResult(name=f"physical limit {r.case} (repeat {result.repeat})", kind="physical-limit", case=r.case,
                        passed=False, reasons=[f"{r.code.value}: {r.detail}"])
            for r in suspicion.limit_reasons(checks)]


def _document(record: RunRecord, repeats: int, chain_head: str | None, checks: list[CheckResult],
              timings: list[tuple[RepeatResult, dict]], env_run: dict, env_now: dict, decision: Decision) -> dict:
    return {
        "run": record.dir.name, "task": record.task.name, "replayed_at": now_iso(),
        "run_status": record.summary.status, "run_chain_head": chain_head,
        "decision": decision.decision, "reasons": decision.reasons,
        "kernel": {**record.kernel.describe(), "is_best": record.is_best},
        "baseline": record.baseline.describe(),
        "protocol": {"repeats": repeats, "timing_rounds": record.settings.timing_rounds,
                     "timing": record.settings.timing.model_dump(mode="json")},
        "checks": [c.model_dump(mode="json") for c in checks],
        "repeats": [{**r.model_dump(mode="json"), **extra} for r, extra in timings],
        "environment": {"run": env_run, "now": env_now,
                        "differences": [d.model_dump(mode="json") for d in environment_differences(env_run, env_now)],
                        "other_differences": [d.model_dump(mode="json")
                                              for d in other_environment_differences(env_run, env_now)]},
        # Informational: the referee's own source files that differ from those the run was locked with.
        "referee_changes": locking.referee_changes(record.lock) if locking.locked_source(record.lock) else [],
    }


# -- the command ------------------------------------------------------------------------------

def output_name(attempt: int | None) -> str:
    return "replay.json" if attempt is None else f"replay-attempt-{attempt:03d}.json"


def replay(run_dir: Path, out: TextIO, *, repeats: int = 3, attempt: int | None = None, confine: bool = True,
           make_executor: MakeExecutor | None = None, sandbox_refusal: Callable[[], str | None] | None = None,
           gpu: str | None = None) -> int:
    """The command, holding the run folder from the verification to the last write (server/folder_lock.py): a
    folder a server or another replay holds is refused (EXIT_HELD). `gpu`: `--gpu`; None: the run's own GPU
    where it is on this host, else one no serving run holds (harness/placement.py)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():  # nothing to hold: the verification says what is missing
        return _replay_held(run_dir, out, repeats, attempt, confine, make_executor, sandbox_refusal, gpu)
    try:
        folder = FolderLock.take(run_dir, "replay")
    except FolderHeld as held:
        print(f"kernel-referee: {held}", file=sys.stderr)
        return EXIT_HELD
    with folder:
        return _replay_held(run_dir, out, repeats, attempt, confine, make_executor, sandbox_refusal, gpu)


def _replay_held(run_dir: Path, out: TextIO, repeats: int, attempt: int | None, confine: bool,
                 make_executor: MakeExecutor | None, sandbox_refusal: Callable[[], str | None] | None,
                 gpu: str | None = None) -> int:
    """Verify, load, replay, write, print. Without `make_executor`, a GpuExecutor on this GPU."""
    if repeats < 1:
        print(f"kernel-referee replay: --repeats must be at least 1 (got {repeats})", file=sys.stderr)
        return EXIT_BAD_RUN
    report = verify_run(run_dir)
    if not report.ok:
        print(f"kernel-referee replay: refused: {run_dir} does not verify ({report.problems[0] if report.problems else '?'}"
              f"; `kernel-referee verify {run_dir}` lists every problem), so nothing in it can be replayed",
              file=sys.stderr)
        return EXIT_BAD_RUN
    print(f"{run_dir}: verified ({report.records} records, chain head {report.head})", file=out)
    try:
        record = load_record(run_dir, attempt)
    except (RunFolderError, OSError, ValueError, KeyError) as exc:
        print(f"kernel-referee replay: {run_dir} cannot be replayed: {exc}", file=sys.stderr)
        return EXIT_BAD_RUN
    if make_executor is None:
        absent = gpu_absent_reason()
        if absent is not None:
            print(f"kernel-referee replay needs an NVIDIA GPU: {absent}. The run folder verifies; nothing was "
                  f"replayed and no {output_name(attempt)} was written.", file=sys.stderr)
            return EXIT_NO_GPU
        refusal = sandbox_refusal() if sandbox_refusal else None
        if refusal:
            print(f"kernel-referee: {refusal}", file=sys.stderr)
            return EXIT_BAD_RUN
        placement = placement_for(list_gpus(), gpu, f"replay {run_dir.name}", locking.locked_gpu_uuid(run_dir))
        try:  # the GPU's serving claim is this replay's only: let go when it ends, whatever the process does next
            document = replay_run(record, lambda task, timing: GpuExecutor(
                task, timing, confine=confine, lease_what=f"replay {run_dir.name}",
                gpu=placement.gpu if placement else None), repeats, report.head, _say)
        finally:
            if placement is not None:
                placement.release()
    else:
        document = replay_run(record, make_executor, repeats, report.head, _say)
    path = run_dir / output_name(attempt)
    write_json_atomic(path, document)
    print_report(document, out)
    print(f"wrote {path}", file=out)
    if attempt is None and (run_dir / REPORT_NAME).exists():  # its "Replay decision" shows this replay
        write_report_files(run_dir)  # and signs derived.json, this replay's document among the derived files
        print(f"wrote {run_dir / REPORT_NAME} again", file=out)
    else:
        _sign_replay(run_dir)
    return EXIT_GO if document["decision"] == "GO" else EXIT_NO_GO


def _sign_replay(run_dir: Path) -> None:
    """The replay's document in the run's signed derived.json (server/signed_log.py); where the run's key cannot
    be read here, `verify` names the document until `kernel-referee report RUN` is run by the key's user."""
    try:
        sign_derived(run_dir)
    except (SigningKeyError, OSError, ValueError) as exc:
        print(f"kernel-referee replay: the replay is not listed in the run's derived.json: {exc}", file=sys.stderr)


def print_report(document: dict, out: TextIO) -> None:
    kernel, now = document["kernel"], document["environment"]["now"]
    which = "best.cu" if kernel["is_best"] else kernel["source_file"]
    print(f"replayed attempt {kernel['attempt']} ({which}) beside the baseline (attempt "
          f"{document['baseline']['attempt']}) on {now.get('gpu', 'no GPU')}", file=out)
    checks = document["checks"]
    print(f"checks: {sum(c['passed'] for c in checks)} of {len(checks)} passed", file=out)
    for check in checks:
        if not check["passed"]:
            print(f"  FAIL {check['name']}: {'; '.join(check['reasons'])[:300]}", file=out)
    for r in document["repeats"]:
        s = r["speedup"]
        said = "; ".join(r["reasons"]) if s is None else (
            f"{s['ratio']:.3g}x [{s['low']:.3g}, {s['high']:.3g}] over the baseline, "
            + significance(s["low"], s["high"], s["beyond_noise"]))
        print(f"repeat {r['repeat']}: {said}", file=out)
        for label, per_case in (r.get("shape_waived") or {}).items():
            print(f"  the {label}'s timing taken as measured though its launches' shape was refused "
                  f"({', '.join(per_case)}): a yardstick, not the kernel being judged", file=out)
    differences = document["environment"]["differences"]
    print("environment: " + ("matches the run's" if not differences else "differs from the run's: " + "; ".join(
        f"{d['field']} {d['run']!r} -> {d['now']!r}" for d in differences)), file=out)
    others = document["environment"]["other_differences"]
    if others:
        print("  also differs (not decisive): " + "; ".join(f"{d['field']} {d['run']!r} -> {d['now']!r}"
                                                          for d in others), file=out)
    if document["referee_changes"]:
        print(f"note: {len(document['referee_changes'])} referee source file(s) differ from those that made the "
              "run (lock.json `referee_source`)", file=out)
    print(document["decision"], file=out)
    for reason in document["reasons"]:
        print(f"  {reason}", file=out)


def _say(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)
