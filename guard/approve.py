"""`kernel-referee approve RUN --store STORE --name NAME`: a signed approval from a finished run's best (or
attempt N).

The run must verify (server/verify.py) and a replay of the kernel must have said GO (server/replay.py): the
replay recorded in the run for this state of it, or one made now on this machine's GPU. `--force` approves
past either, and the approval records what it overrode. The approval is written to the store only after it
is signed with a key the store trusts, so a store never holds an approval its own guard would refuse.

Each case's accepted ratio (the kernel's latency over its baseline's, which the guard holds later runs to) is
measured here, on this machine's GPU, as the guard measures a run's: `--ratio-rounds` interleaved rounds (32)
through the guard step's own timing (guard/measure.py, guard/accepted.py), their interval counting the shift
between jobs, in four sittings, each a fresh guard step with its checks first, on one GPU (guard/sittings.py):
the shift between executors weighed as the guard's runs meet it. `--from-run` takes the run's own timing
instead (two jobs per kernel, merged: an interval that leaves that shift out); the approval records which
(`ratio_measurement`).
"""

from __future__ import annotations

import getpass
import hashlib
import io
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from guard import accepted
from guard.approval import (BASELINE_FILE, KERNEL_FILE, TASK_FOLDER, AcceptedRatio, Approval, ApprovedKernel,
                            CaseLatency, Provenance, RatioMeasurement, ReplayDecision, Statement, TaskCopy)
from guard.fingerprint import referee_fingerprint, run_fingerprint
from guard.measure import GuardStep, GuardSubject, TimingRefused, local_executor
from guard.sittings import SittingFailed, Sittings
from guard.run_evidence import RecordedReplay, RunEvidence, read_run, replay_gpu
from guard.signing import ApprovalKeyError, key_id, load_private, sign, trusted_keys
from guard.store import approval_dir, keys_dir, write_approval
from harness.device import gpu_absent_reason
from harness.stats import LatencyStats, Speedup
from server.cli_errors import one_line
from server.lock import digest
from server.replay import MakeExecutor, replay
from server.replay_record import Subject
from server.run import now_iso
from server.settings import sandbox_refusal

EXIT_APPROVED, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_NO_GPU = 0, 1, 2, 3
log = logging.getLogger(__name__)


@dataclass
class ApproveOptions:
    run: Path
    store: Path
    name: str
    key: Path
    attempt: int | None = None
    note: str | None = None
    force: bool = False
    repeats: int = 3  # the replay's, where one is made now
    confine: bool = True
    gpu: str | None = None
    approver: str = field(default_factory=getpass.getuser)
    ratio_rounds: int = accepted.DEFAULT_ROUNDS  # the accepted ratio's interleaved rounds per case
    from_run: bool = False  # take the accepted ratio from the run's own timing instead (recorded)
    make_executor: MakeExecutor | None = None  # the replay's and the rounds' executor; None: a GpuExecutor on this GPU
    gpu_absent: Callable[[], str | None] | None = None  # None: harness/device.py's probe


class Refused(Exception):
    """The run cannot be approved without --force; the message says why and what to do."""


def approve(options: ApproveOptions, out: TextIO) -> int:
    """Verify, replay where needed, build, sign, write; the exit status (0 approved, 1 refused, 3 no GPU)."""
    if not Path(options.run).is_dir():
        raise FileNotFoundError(f"{options.run}: no such run folder")
    private = load_private(options.key)
    if key_id(private.public_key()) not in trusted_keys(keys_dir(options.store)):
        raise ApprovalKeyError(f"the key {options.key} ({key_id(private.public_key())[:16]}...) is not trusted by "
                               f"the store: copy its .pub into {keys_dir(options.store)}/ (and commit it) first")
    if approval_dir(options.store, options.name).exists():
        raise FileExistsError(f"{approval_dir(options.store, options.name)} exists: an approval is replaced "
                              "knowingly (remove it first, in git)")
    overrides: list[str] = []
    try:
        evidence = read_run(options.run, options.attempt)
        _hold_verified(evidence, options, overrides)
        decision = _replay_decision(evidence, options, out, overrides)
        measurement, ratios = _accepted_ratios(evidence, options, out, overrides)
    except Refused as refused:
        print(f"kernel-referee approve: refused: {refused}", file=sys.stderr)
        return EXIT_REFUSED
    except _NoGpu as none:
        print(f"kernel-referee approve: {none}", file=sys.stderr)
        return EXIT_NO_GPU
    approval, files = build_approval(read_run(options.run, options.attempt), options, decision, overrides,
                                     measurement, ratios)
    statement = Statement.of(approval)
    folder = write_approval(options.store, statement, sign(statement.to_json(), private), files)
    print(f"approved attempt {approval.kernel.attempt} of {approval.provenance.run} as {options.name}: {folder}"
          + (f" (forced past: {'; '.join(overrides)})" if overrides else ""), file=out)
    for case in approval.cases:
        ratio = f", {case.speedup.ratio:.3g}x the baseline" if case.speedup else ""
        held = case.ratio
        rounds = (f"; accepted ratio {held.estimate:.4g} [{held.low:.4g}, {held.high:.4g}] over {held.rounds} "
                  "rounds" if held else "; accepted ratio from the run's timing")
        if held and held.shape_waived:
            rounds += " (taken as measured though their launches' shape was refused: " + ", ".join(
                f"the {label}'s in {count}" for label, count in held.shape_waived.items()) + ")"
        print(f"  {case.case}: median {case.kernel.median_ms:.4g} ms [{case.kernel.ci_low_ms:.4g}, "
              f"{case.kernel.ci_high_ms:.4g}]{ratio}{rounds}", file=out)
    return EXIT_APPROVED


class _NoGpu(Exception):
    """No replay of the kernel is recorded and this machine has no GPU to make one."""


def _hold_verified(evidence: RunEvidence, options: ApproveOptions, overrides: list[str]) -> None:
    """A run that verifies, is signed and is finished (its best can no longer change); else refused or forced."""
    status = evidence.record.summary.status
    whys = [why for bad, why in (
        (not evidence.report.ok, f"{evidence.dir} does not verify ({(evidence.report.problems or ['?'])[0]}; "
                                 f"`kernel-referee verify {evidence.dir}` lists every problem)"),
        (evidence.report.ok and not evidence.report.signed, f"{evidence.dir} was made before signing: its log is "
                                                            "not signed"),
        (not evidence.record.summary.finished, f"the run is not finished (status {status}): its best may change"),
    ) if bad]
    if whys and not options.force:
        raise Refused(whys[0])
    overrides += whys


def _replay_decision(evidence: RunEvidence, options: ApproveOptions, out: TextIO,
                     overrides: list[str]) -> ReplayDecision:
    replayed = evidence.replay or _replay_now(evidence, options, out, overrides)
    if replayed is None:
        return ReplayDecision(decision="none")
    decision = ReplayDecision(decision=replayed.decision, reasons=list(replayed.document.get("reasons") or []),
                              document=replayed.name, document_sha256=replayed.sha256,
                              replayed_at=replayed.document.get("replayed_at"), gpu=replay_gpu(replayed))
    if decision.decision != "GO":
        why = f"its replay ({replayed.name}) says {decision.decision}: {'; '.join(decision.reasons)[:500]}"
        if not options.force:
            raise Refused(why)
        overrides.append(why)
    return decision


def _replay_now(evidence: RunEvidence, options: ApproveOptions, out: TextIO,
                overrides: list[str]) -> RecordedReplay | None:
    """A replay made now, where none of this kernel is recorded (on the GPU, or the injected executor)."""
    absent = (options.gpu_absent or gpu_absent_reason)() if options.make_executor is None else None
    if absent is None and evidence.report.ok:
        said = io.StringIO()
        replay(evidence.dir, said, repeats=options.repeats, attempt=options.attempt, confine=options.confine,
               make_executor=options.make_executor, gpu=options.gpu)
        print(said.getvalue(), end="", file=out)
        replayed = read_run(evidence.dir, options.attempt).replay
        if replayed is not None:
            return replayed
    why = (f"no replay of attempt {evidence.attempt} is recorded for this state of the run"
           + (f", and none can be made here ({absent})" if absent else ""))
    if not options.force:
        if absent:
            raise _NoGpu(f"{why}: run `kernel-referee replay {evidence.dir}` on a GPU first, or approve with --force")
        raise Refused(why)
    overrides.append(why)
    return None


def _accepted_ratios(evidence: RunEvidence, options: ApproveOptions, out: TextIO,
                     overrides: list[str]) -> tuple[RatioMeasurement, dict[str, AcceptedRatio]]:
    """Each case's accepted ratio in interleaved rounds on this GPU (or the injected executor), or, with
    --from-run, the run's own timing; what was done, for the approval. With --force, a ratio that cannot be
    measured here falls back to the run's, as an override."""
    if options.from_run:
        return RatioMeasurement(source="run", why="approve --from-run: the run's timing jobs merged, an interval "
                                                  "that leaves out the shift between jobs"), {}
    try:
        return _measured_ratios(evidence, options, out)
    except (_NoGpu, Refused) as failed:
        if not options.force:
            raise
        why = f"the accepted ratio was not measured in rounds ({failed}); the run's timing was taken"
        overrides.append(why)
        return RatioMeasurement(source="run", why=why), {}


def _measured_ratios(evidence: RunEvidence, options: ApproveOptions,
                     out: TextIO) -> tuple[RatioMeasurement, dict[str, AcceptedRatio]]:
    make = options.make_executor
    if make is None:
        absent = (options.gpu_absent or gpu_absent_reason)()
        if absent:
            raise _NoGpu(f"the accepted ratio is measured on a GPU ({options.ratio_rounds} interleaved rounds) and "
                         f"this machine has none ({absent}): approve on a GPU, or give --from-run to take the run's "
                         "own timing (recorded in the approval)")
        refusal = sandbox_refusal(options.confine)
        if refusal:
            raise Refused(f"{refusal} (or approve with --no-sandbox, or --from-run)")
        make = local_executor(options.name, options.confine, options.gpu)
    record = evidence.record
    subject = GuardSubject(name=options.name, task=record.task, kernel=record.kernel, baseline=record.baseline,
                           timing=record.settings.timing)
    say = lambda message: print(message, file=out)  # noqa: E731
    cases = [c.name for c in record.task.performance_cases]
    pin = options.make_executor is None and options.gpu is None  # later sittings on the first one's GPU

    def open_step(first_gpu: str | None) -> GuardStep:
        placed = local_executor(options.name, options.confine, first_gpu) if pin and first_gpu else make
        return GuardStep(subject, placed, say)

    try:
        with Sittings.for_rounds(open_step, options.ratio_rounds) as sittings:
            ratios = accepted.measure(sittings, cases, options.ratio_rounds, say=say)
    except SittingFailed as failed:
        raise Refused(f"measuring the accepted ratio: {failed}") from None
    except TimingRefused as refused:
        raise Refused(f"measuring the accepted ratio: {refused}") from None
    except accepted.RatioUnmeasured as short:
        raise Refused(f"the accepted ratio could not be measured: {short}; approve on a GPU no other process uses, "
                      "or with --from-run") from None
    except Exception as failed:  # noqa: BLE001 - the executor's start, a worker, a lease wait: refused, as in replay
        # One line names it (the command's refusal, the service's review record); its traceback only at debug level.
        log.debug("the accepted ratio could not be measured", exc_info=True)
        raise Refused(f"the accepted ratio could not be measured, its executor failed: {type(failed).__name__}: "
                      f"{one_line(failed)}; or approve with --from-run") from None
    environment, cost = sittings.environment, sittings.cost
    measurement = RatioMeasurement(
        source="guard-rounds", rounds=max((r.rounds for r in ratios.values()), default=None),
        gpu=environment.get("gpu"), gpu_uuid=environment.get("gpu_uuid"), measured_at=now_iso(),
        why=f"{cost.rounds} rounds of the guard's timing in {sittings.sittings} guard steps (a fresh executor each, "
            f"its checks first), {cost.timing_s:.1f} s of it")
    return measurement, ratios


def build_approval(evidence: RunEvidence, options: ApproveOptions, decision: ReplayDecision, overrides: list[str],
                   measurement: RatioMeasurement | None = None,
                   ratios: dict[str, AcceptedRatio] | None = None) -> tuple[Approval, dict[str, bytes]]:
    """The approval of the run's kernel and the files it names (kernel, baseline, task copy), by relative path."""
    record = evidence.record
    task_files = {f"{TASK_FOLDER}/{p.relative_to(record.dir / 'task').as_posix()}": p.read_bytes()
                  for p in sorted((record.dir / "task").rglob("*")) if p.is_file()}
    files = {KERNEL_FILE: record.kernel.source.encode(), BASELINE_FILE: record.baseline.source.encode(), **task_files}
    hashes = {name: _sha256(data) for name, data in files.items()}
    task_hashes = {name: hashes[name] for name in task_files}
    lock = record.lock
    referee = {**referee_fingerprint(), "referee_source_sha256": lock.get("referee_source_sha256"),
               "referee_source": lock.get("referee_source") or {}}  # the referee that measured the run
    approval = Approval(
        name=options.name, task=TaskCopy(name=record.task.name, files=task_hashes, sha256=digest(task_hashes)),
        kernel=_kernel(KERNEL_FILE, hashes[KERNEL_FILE], record.kernel),
        baseline=_kernel(BASELINE_FILE, hashes[BASELINE_FILE], record.baseline),
        cases=_cases(evidence, ratios or {}), ratio_measurement=measurement,
        speedup=Speedup.model_validate(evidence.entry.speedup_vs_baseline.to_json())
        if _complete(evidence.entry.speedup_vs_baseline) else None,
        timing=record.settings.timing.model_dump(mode="json"), timing_rounds=record.settings.timing_rounds,
        fingerprint=run_fingerprint(lock.get("environment") or {}, referee=referee),
        provenance=Provenance(
            run=record.dir.name, task=record.task.name, chain_head=evidence.report.head or "",
            chain_records=evidence.report.records, run_key_fingerprint=evidence.report.fingerprint,
            replay=decision, approver=options.approver, approved_at=now_iso(), note=options.note,
            forced=bool(overrides), forced_over=overrides))
    return approval, files


def _kernel(file: str, sha256: str, subject: Subject) -> ApprovedKernel:
    return ApprovedKernel(file=file, sha256=sha256, attempt=subject.attempt, options=list(subject.options),
                          launch=subject.launch.model_dump(mode="json"))


def _cases(evidence: RunEvidence, ratios: dict[str, AcceptedRatio]) -> list[CaseLatency]:
    """Each performance case's accepted latency, as the run timed it side by side with the baseline, and its
    accepted ratio where measured in rounds."""
    cases = []
    for name, row in sorted((evidence.entry.timing or {}).items()):
        if not _complete(row.stats):
            continue
        cases.append(CaseLatency(
            case=name, kernel=LatencyStats.model_validate(row.stats.to_json()),
            baseline=LatencyStats.model_validate(row.baseline_stats.to_json()) if _complete(row.baseline_stats) else None,
            speedup=Speedup.model_validate(row.speedup_vs_baseline.to_json())
            if _complete(row.speedup_vs_baseline) else None,
            samples_ms=list(row.samples_ms or []), clock=row.clock, ratio=ratios.get(name)))
    return cases


def _complete(record) -> bool:
    """A stats or speedup record with every field written (a record of an older run may lack some)."""
    return record is not None and None not in record.to_json().values()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
