"""Compiles answered before a run is prepared: a run queued for a GPU compiles on the CPU (NVRTC needs no GPU),
for the arch it will run on, so that its agent can work while it waits.

Nothing goes into the run folder meanwhile: its audit log begins with the run's creation, written once the run has
its GPU (server/lifecycle.py `_begin`). The compiles are kept here and recorded into the run once it is prepared
(its candidates and compile logs, as a compile then writes them), so that their candidate ids serve the GPU tools
after. No attempt, probe or GPU second is counted; the compile rate limit is, in memory.

Where a journal is given (the service keeps one beside each queued run, outside its run folder), each new candidate
is appended to it as one JSON line (source, options, launch, compiler log) before its answer goes out, so that a
process killed while the run waits loses none: `EarlyCompiles.reload` reads them back, a torn last line left out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.task_model import LaunchSpec
from harness.worker_side.nvrtc import check_request
from server import probes
from server.candidates import Candidate, candidate_id
from server.models import CompileAnswer
from server.run import Run


class EarlyCompiles:
    """The compiles of one run while it waits, for `arch` (the arch every GPU it may get has)."""

    def __init__(self, arch: str, journal: Path | None = None):
        self.arch = arch
        self.journal = journal
        self.candidates: dict[str, Candidate] = {}
        self.logs: dict[str, str] = {}  # each candidate's full compiler log, its compile-logs resource meanwhile
        self.closed = False

    @classmethod
    def reload(cls, arch: str, journal: Path) -> "EarlyCompiles":
        """The compiles a journal kept (none where it does not exist), appended to it from here on."""
        early = cls(arch, journal)
        for candidate, log in read_journal(journal):
            early.candidates.setdefault(candidate.id, candidate)
            early.logs[candidate.id] = log
        return early

    def compile(self, run: Run, source: str, options: list[str] | None, launch: dict | None) -> CompileAnswer:
        """compile_kernel's answer, made as a prepared run makes it (the same id, log, resources and verdict on
        its arithmetic). Once the run got its GPU, refused with its preparation's refusal."""
        with run.exclusive():  # the service swaps the run's executor under it when the run gets its GPU
            if self.closed:
                raise run.preparation.refusal()
            spec = run.task.launch if launch is None else run.launch_spec(launch)
            wanted = tuple(options or ())
            check_request(source, run.task.kernel_name, wanted, self.arch)  # CompileRefused: nothing charged
            run.charge_compile(logged=False)
            candidate = Candidate(candidate_id(source, wanted, spec), source, wanted, spec)
            compiled = run.executor.compile(source, wanted)
            if candidate.id not in self.candidates and self.journal is not None:
                _append(self.journal, candidate, compiled.full_log)
            self.candidates.setdefault(candidate.id, candidate)
            self.logs[candidate.id] = compiled.full_log
            return probes.compile_answer(run, candidate, compiled)

    def log(self, candidate: str) -> str | None:
        return self.logs.get(candidate)

    def close(self) -> None:
        """The run got its GPU: no compile is answered here any more. Called with the run's mutex held."""
        self.closed = True

    def record_into(self, run: Run) -> None:
        """Once the run is prepared: each candidate compiled meanwhile becomes the run's (candidates/, its compile
        log, in the audit log), compiled again through the run's executor, whose cache holds it already."""
        with run.exclusive():
            for early in self.candidates.values():
                run.kernel(run.register_candidate(early.source, early.options, early.launch))
        if self.journal is not None:
            self.journal.unlink(missing_ok=True)  # the run folder holds them now


def read_journal(journal: Path) -> list[tuple[Candidate, str]]:
    """Each (candidate, compiler log) a journal holds, in order; a line cut by a kill, or not a candidate's, left out.
    A candidate is named by its own contents, so a line changed by hand is a different candidate, never a mislabel."""
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    kept = []
    for line in lines:
        try:
            entry = json.loads(line)
            launch = LaunchSpec.model_validate(entry["launch"])
            options = tuple(str(o) for o in entry["options"])
            source = str(entry["source"])
            kept.append((Candidate(candidate_id(source, options, launch), source, options, launch),
                         str(entry.get("log", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    return kept


def _append(journal: Path, candidate: Candidate, log: str) -> None:
    line = json.dumps({"source": candidate.source, "options": list(candidate.options),
                       "launch": candidate.launch.model_dump(mode="json"), "log": log}, sort_keys=True)
    with open(journal, "a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())
