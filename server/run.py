"""A run: one task, one budget of attempts, one audit folder, resumable and locked.

Everything here is synchronous and GPU-agnostic (it talks to an Executor). The MCP layer calls one
method per tool, from a worker thread, and turns `Refusal` into a tool error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, Field, ValidationError

from harness.arithmetic import arithmetic_reason
from harness.call_limits import call_limits
from harness.launch_checks import check_candidate_launch
from harness.results import Reason
from harness.worker_side.compile_policy import DEFAULT_ARCH
from harness.worker_side.nvrtc import check_request
from harness.settings import CompiledKernel, TimingSettings
from harness.task_model import Case, LaunchSpec, Task
from sandbox.deadline import Deadline
from server.audit import AuditLog, write_bytes_atomic, write_json_atomic
from server.call import CALL_DEADLINE_S, Progress
from server.candidates import Candidate, candidate_id
from server.executor import Executor
from server.locked_files import LockedFiles
from server.models import Budget
from server.rate_limit import RateLimited, SlidingWindow, ages_s
from server.record_files import HISTORY, SUMMARY, iter_events, read_history, read_summary
from server.records import AttemptRecord, EventKind, SummaryFile

log = logging.getLogger(__name__)
# Calls before which every locked file is hashed, not only those whose stat identity changed: the official
# steps (server/locked_files.py says what each check catches).
FULLY_CHECKED = frozenset({"record_attempt", "finish"})
PROFILE_TOOL = "profile_kernel"  # its probes count against their own GPU-time cap too


class Refusal(Exception):
    """A call the run refuses; the message says what is left and what to do."""


class RunError(RuntimeError):
    """A run that cannot be created or resumed (broken task, tampered folder, changed harness)."""


class TaskDoesNotFit(RunError):
    """A case needs more device or host memory, or disk, than this machine has: refused before a run folder is
    made (harness/footprint.py)."""


class RunSettings(BaseModel):
    max_attempts: int = 7
    probes_per_window: int = 20
    probe_gpu_seconds_per_window: float = 120.0
    profile: bool = False  # profile_kernel (Nsight Compute) answers only when the run was served with --profile
    profile_gpu_seconds_per_window: float = 60.0  # profile_kernel's own cap, within the probes' GPU seconds
    compiles_per_minute: int = 30
    timing_rounds: int = Field(2, ge=1)  # at least one: the candidate is timed, and its arithmetic judged before
    timing: TimingSettings = TimingSettings()
    # Cases judged on the device keep their expected outputs there: the run folder holds each output's
    # sha256-tree (expected/CASE/SET/OUTPUT.sha256-tree), and a resumed run or a replay computes them again and
    # must find the same. True (serve --keep-expected): their .npy files are written as for every other case.
    keep_expected: bool = False
    # Where the run's private signing key lives (serve --key-dir: a folder only the referee's user can read);
    # None: in the run folder (server/keys.py, docs/security.md "The audit log").
    key_dir: Path | None = None

    @classmethod
    def of_run(cls, run_dir: Path) -> "RunSettings":
        """The settings a run was made with. A run made before the kernel clock existed keeps the
        events it was timed with, resumed or replayed."""
        settings = json.loads((run_dir / "run.json").read_text())["settings"]
        timing = settings.get("timing") if isinstance(settings, dict) else None
        if isinstance(timing, dict) and "clock" not in timing:
            settings = {**settings, "timing": {**timing, "clock": "events"}}
        return cls.model_validate(settings)


_ATTEMPT_FILE = re.compile(r"attempts/[0-9]{3}\.cu")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Run:
    """Budget, probes, lock and history of one run folder. Made and resumed by server/lifecycle.py."""

    def __init__(self, run_dir: Path, task: Task, settings: RunSettings, executor: Executor, environment: dict,
                 key: Any = None):
        self.dir = run_dir
        self.task = task
        self.settings = settings
        self.executor = executor
        self.environment = environment
        self.key = key  # the run's signing key (server/keys.py): the log signs every record with it
        self.audit = AuditLog(run_dir / "events.jsonl", signer=key)
        self.lock_record = json.loads((run_dir / "lock.json").read_text()) if (run_dir / "lock.json").exists() else None
        self.history: list[AttemptRecord] = []
        self.candidates: dict[str, Candidate] = {}
        self.summary = SummaryFile()
        self.probes_in_window = 0
        self.gpu_seconds_in_window = 0.0
        self.gpu_seconds_total = 0.0
        self.profile_seconds_in_window = 0.0  # profile_kernel's share of gpu_seconds_in_window
        self.compiles_total = 0
        self.probes_total = 0
        self.compile_rate = SlidingWindow(settings.compiles_per_minute)
        self.logged_attempts: set[int] = set()  # attempt slots whose source write is in the audit log
        # What describe_task and referee://task answer: made by the call that last changed the run, under the
        # run's mutex, so that those reads need neither the mutex nor the gate (server/probes.py publish).
        self.published: Any = None
        self.call_deadline_s = CALL_DEADLINE_S  # every tool call's, from its arrival (tests shorten it)
        self._mutex = threading.Lock()
        self._folder_moves = threading.Lock()  # held while the folder moves into place and while it is listed
        self.folder_lock = None  # server/folder_lock.py's FolderLock: this process alone writes the folder
        self.preparation = None  # server/preparation.py's, while a new run is prepared behind its server
        self.report_due = False  # it ended in this process and its report is not written yet (report_files.py)

    @property
    def lock_record(self) -> dict | None:
        return self._lock_record

    @lock_record.setter
    def lock_record(self, record: dict | None) -> None:
        self._lock_record = record
        self.locked_files = LockedFiles(self.dir, record["files"]) if record is not None else None

    # -- state ---------------------------------------------------------------------------------
    def load_state(self) -> None:
        """History, summary, candidates and counters from the folder and its log (a resumed run)."""
        self.history = read_history(self.dir).attempts if (self.dir / HISTORY).exists() else []
        if not any(entry.attempt == 0 for entry in self.history):
            raise RunError(f"{self.dir.name} stopped before its baseline (attempt 0) was recorded: nothing was "
                           "attempted yet; start a new run with --task")
        self.summary = read_summary(self.dir) if (self.dir / SUMMARY).exists() else SummaryFile()
        for path in sorted((self.dir / "candidates").glob("*.json")):
            data = json.loads(path.read_text())
            self.candidates[data["id"]] = Candidate(data["id"], data["source"], tuple(data["options"]),
                                                    LaunchSpec.model_validate(data["launch"]))
        self._count_window()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """One call at a time changes the run."""
        with self._mutex:
            yield

    @contextmanager
    def folder_moving(self) -> Iterator[None]:
        """The folder is renamed and `dir` follows it: a read of the folder meanwhile (describe_task's budget, while
        a new run is prepared behind its server) waits, rather than list a folder that is gone."""
        with self._folder_moves:
            yield

    @contextmanager
    def within(self, deadline: Deadline) -> Iterator[None]:
        """A tool call's work: every job it sends ends by `deadline`, and the candidate's launches are limited
        by the baseline's (harness/call_limits.py). A call whose time ran out waiting for another is refused."""
        if deadline.expired:
            raise Refusal(f"this call waited its whole {deadline.seconds:g} s for another call to finish; nothing "
                          "was done or spent. Call it again.")
        baseline = next((entry for entry in self.history if entry.attempt == 0), None)
        with self.executor.within(call_limits(self.task, deadline, baseline.medians() if baseline else {})):
            yield

    def claim_slot(self, number: int, source: str) -> None:
        """Write and log attempts/NNN.cu. If that fails (a full disk), nothing is claimed and the error is raised."""
        path = self.dir / "attempts" / f"{number:03d}.cu"
        claim = path.with_suffix(".claim")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        try:
            self.audit.record_file(path.relative_to(self.dir), write_bytes_atomic(path, source.encode()))
            self.logged_attempts.add(number)
        except BaseException:
            path.unlink(missing_ok=True)  # not logged, so not claimed: a leftover would count without a record
            raise
        finally:
            claim.unlink()  # a leftover claim would refuse this slot number forever

    def open_attempt_window(self) -> None:
        """An attempt started: the probe limits count afresh."""
        self.probes_in_window, self.gpu_seconds_in_window, self.profile_seconds_in_window = 0, 0.0, 0.0

    def add_gpu_seconds(self, seconds: float) -> None:
        self.gpu_seconds_total += seconds

    def add_entry(self, entry: AttemptRecord) -> None:
        """An attempt's history entry, kept in attempt order."""
        self.history.append(entry)
        self.history.sort(key=lambda e: e.attempt)

    def forget_attempt(self, number: int, best_before: int) -> None:
        """Undo what a failed attempt changed in memory: its entry, and the best it may have become."""
        self.history = [e for e in self.history if e.attempt != number]
        self.summary.best_attempt = best_before

    def update_summary(self, fields: dict) -> None:
        self.summary.update(**fields)

    @property
    def best_number(self) -> int:
        return self.summary.best_number

    def _count_window(self) -> None:
        """Probes since the last attempt, from the audit log: a restart does not reset them."""
        for record in iter_events(self.dir):
            if record.kind == EventKind.ATTEMPT_STARTED:
                self.probes_in_window, self.gpu_seconds_in_window, self.profile_seconds_in_window = 0, 0.0, 0.0
            elif record.kind == EventKind.PROBE_DONE:
                self.probes_in_window += 1
                self.probes_total += 1
                self.gpu_seconds_in_window += record.data.get("gpu_seconds", 0.0)
                if record.data.get("tool") == PROFILE_TOOL:
                    self.profile_seconds_in_window += record.data.get("gpu_seconds", 0.0)
            if record.kind in (EventKind.PROBE_DONE, EventKind.ATTEMPT_DONE, EventKind.BASELINE_DONE):
                self.gpu_seconds_total += record.data.get("gpu_seconds", 0.0)
            if record.kind == EventKind.COMPILED:
                self.compiles_total += 1
            path = record.data.get("path", "") if record.kind == EventKind.FILE_WRITTEN else ""
            if _ATTEMPT_FILE.fullmatch(path):
                self.logged_attempts.add(int(path[9:12]))
        # A restart must not hand out a fresh minute of compiles either.
        self.compile_rate.restore(ages_s(e.time for e in iter_events(self.dir) if e.kind == "compile_charged"))

    # -- files ---------------------------------------------------------------------------------
    def write_json(self, name: str, value) -> None:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.audit.record_file(path.relative_to(self.dir), write_json_atomic(path, value))

    def write_text(self, name: str, text: str) -> None:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.audit.record_file(path.relative_to(self.dir), write_bytes_atomic(path, text.encode()))

    # -- guards --------------------------------------------------------------------------------
    def guard(self, tool: str, arguments: dict, *, needs_budget: bool = True) -> None:
        """Before every call: log it, check the lock, refuse when the run is over. Safe without the run's mutex
        when `needs_budget` is off (a read-only call)."""
        self.audit.append(EventKind.CALL, {"tool": tool, "arguments": arguments})
        problems = self.locked_files.problems(full=tool in FULLY_CHECKED)
        if problems:
            self.audit.append(EventKind.TAMPER, {"tool": tool, "problems": problems})
            raise Refusal(f"refused: the run's locked files changed ({'; '.join(problems)}). The task copy and "
                          "the expected outputs must stay as they were when the run began; this is logged.")
        if needs_budget and self.finished:
            raise Refusal(f"the run is finished ({self.summary.stop_reason}); no more probes or attempts. "
                          "Read referee://summary.json for the result.")

    @property
    def finished(self) -> bool:
        return self.summary.finished

    @property
    def attempts_used(self) -> int:
        """Attempt slots claimed (a claimed slot counts even if the server died during it)."""
        return len(self.claimed_attempts() - {0})

    def claimed_attempts(self) -> set[int]:
        """Slots claimed by a file in attempts/ or by the log: deleting a file gives nothing back."""
        with self.folder_moving():
            on_disk = {int(p.stem) for p in (self.dir / "attempts").glob("[0-9][0-9][0-9].cu")}
        return on_disk | self.logged_attempts

    def budget(self) -> Budget:
        s = self.settings
        return Budget(max_attempts=s.max_attempts, attempts_used=self.attempts_used,
                      attempts_left=max(0, s.max_attempts - self.attempts_used),
                      probes_left_in_window=max(0, s.probes_per_window - self.probes_in_window),
                      probe_gpu_seconds_left_in_window=max(0.0, s.probe_gpu_seconds_per_window - self.gpu_seconds_in_window),
                      finished=self.finished, stop_reason=self.summary.stop_reason)

    def charge_probe(self) -> None:
        s = self.settings
        if self.probes_in_window >= s.probes_per_window or self.gpu_seconds_in_window >= s.probe_gpu_seconds_per_window:
            left = s.max_attempts - self.attempts_used
            raise Refusal(f"probe limit reached for this attempt window ({s.probes_per_window} probes or "
                          f"{s.probe_gpu_seconds_per_window:g} GPU seconds). Record an attempt with record_attempt "
                          f"({left} left) to open a new window, or call finish.")

    def probe_done(self, tool: str, gpu_seconds: float, result: dict) -> None:
        # Counted once logged: a resumed run counts probes from the log.
        self.audit.append(EventKind.PROBE_DONE, {"tool": tool, "gpu_seconds": round(gpu_seconds, 6), **result})
        self.probes_in_window += 1
        self.probes_total += 1
        self.gpu_seconds_in_window += gpu_seconds
        self.gpu_seconds_total += gpu_seconds
        if tool == PROFILE_TOOL:
            self.profile_seconds_in_window += gpu_seconds

    def charge_compile(self, *, logged: bool = True) -> None:
        """Count a compile against the rate limit; `logged` off: in memory only (a run whose log has not begun)."""
        try:
            self.compile_rate.charge()
        except RateLimited as limited:
            raise Refusal(f"compile rate limit: {self.settings.compiles_per_minute} compiles per minute; "
                          f"{limited} (reuse candidate ids instead of recompiling)") from None
        if logged:
            self.audit.append(EventKind.COMPILE_CHARGED, {})

    # -- candidates ----------------------------------------------------------------------------
    def candidate(self, candidate_id: str | None, source: str | None, options: list[str] | None = None,
                  launch: dict | None = None) -> Candidate:
        """The candidate named by id, or made from source; a launch given here overrides the id's. A source is
        compiled, whatever the tool: it counts against the compile rate limit."""
        if (candidate_id is None) == (source is None):
            raise Refusal("give exactly one of `candidate_id` (an id from compile_kernel) or `source`")
        if candidate_id is None:
            spec = self.task.launch if launch is None else self.launch_spec(launch)
            return self.register_candidate(source, tuple(options or ()), spec, charge_compile=True)
        if candidate_id not in self.candidates:
            raise Refusal(f"unknown candidate id {candidate_id[:40]!r}: compile_kernel returns ids "
                          f"({len(self.candidates)} known in this run)")
        known = self.candidates[candidate_id]
        options = list(known.options) if options is None else options
        spec = known.launch if launch is None else self.launch_spec(launch)
        return self.register_candidate(known.source, tuple(options or ()), spec)

    def launch_spec(self, launch: dict) -> LaunchSpec:
        try:
            spec = LaunchSpec.model_validate(launch)
            check_candidate_launch(spec, self.task.visible_cases)
        except (ValidationError, ValueError) as exc:
            raise Refusal(f"invalid launch geometry: {exc}".replace("\n", " ")[:800]) from None
        return spec

    def register_candidate(self, source: str, options: tuple[str, ...], launch: LaunchSpec, *,
                           charge_compile: bool = False) -> Candidate:
        # Refused by policy (CompileRefused) before anything is recorded or an attempt slot is claimed.
        check_request(source, self.task.kernel_name, options, self.environment.get("arch") or DEFAULT_ARCH)
        if charge_compile:
            self.charge_compile()  # a request the policy refused compiles nothing and is not counted
        cid = candidate_id(source, options, launch)
        if cid not in self.candidates:
            # Written before it is known: a candidate this run knows is one a resumed run knows too.
            self.write_json(f"candidates/{cid}.json", {"id": cid, "source": source, "options": list(options),
                                                        "launch": launch.model_dump(mode="json")})
            self.candidates[cid] = Candidate(cid, source, options, launch)
        return self.candidates[cid]

    def kernel(self, candidate: Candidate) -> tuple[CompiledKernel | None, Any]:
        """(CompiledKernel, compile result); the CompiledKernel is None when the source does not compile, or when
        its instructions use units the task forbids (arithmetic_refusal says which). Every tool compiles here
        (record_attempt's checks through server/mix_reading.py, which reads the instructions beside them)."""
        compiled = self.executor.compile(candidate.source, candidate.options)
        self.note_compile(candidate, compiled)
        return self.kernel_of(candidate, compiled), compiled

    def kernel_of(self, candidate: Candidate, compiled) -> CompiledKernel | None:
        """The kernel a compile result makes: None where it failed, or its instructions break the arithmetic."""
        if not compiled.ok or self.arithmetic_refusal(candidate, compiled) is not None:
            return None
        return CompiledKernel(candidate.id, compiled.cubin, compiled.lowered_name, candidate.launch)

    def note_compile(self, candidate: Candidate, compiled) -> None:
        """A compile's audit event and log resource."""
        if not compiled.cache_hit:
            self.compiles_total += 1
            self.audit.append(EventKind.COMPILED, {"candidate": candidate.id, "ok": compiled.ok,
                                           "compile_ms": round(compiled.compile_ms, 3)})
        if not compiled.cache_hit or not (self.dir / f"compile-logs/{candidate.id}.log").exists():
            # A cache hit may be a new candidate (same source, another launch): its log resource must exist too.
            self.write_text(f"compile-logs/{candidate.id}.log", compiled.full_log)

    def arithmetic_refusal(self, candidate: Candidate, compiled) -> Reason | None:
        """Why a compiled candidate breaks the task's `arithmetic` (harness/arithmetic.py), or None. The task's
        own initial kernel, as written, is the author's and is not held to it."""
        if not compiled.ok or (candidate.source == self.task.source("initial") and not candidate.options):
            return None
        return arithmetic_reason(self.task.arithmetic, compiled.mix)

    def cases_named(self, names: list[str] | None, *, performance_only: bool = False) -> list[Case]:
        pool = list(self.task.performance_cases if performance_only else self.task.visible_cases)
        if not names:
            return pool
        names = list(dict.fromkeys(names))  # each case once: a repeated name is not run (or timed) again
        by_name = {c.name: c for c in pool}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            kind = "performance" if performance_only else "visible"
            raise Refusal(f"unknown case(s) {unknown[:5]}; the {kind} cases are {sorted(by_name)}")
        return [by_name[n] for n in names]

    def close(self) -> None:
        self.audit.close()
        if self.folder_lock is not None:
            self.folder_lock.release()
