"""What an approval takes from a run folder, through one reader: the folder verified (its signed log, files,
derived.json), the replay record of the kernel (server/replay_record.py: task, settings, lock, the kernel and
the baseline), the kernel's history entry (its accepted timing), and the replay document that judged it.

A replay document counts only where it judged this kernel in this state of the run: its chain head is the
run's and its kernel's sha256 is the one approved. It is a derived file, so `verify` already holds it to the
run's signed derived.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from server.record_files import read_history
from server.records import AttemptRecord
from server.replay import output_name
from server.replay_record import RunFolderError, RunRecord, load_record
from server.verify import VerifyReport, verify_run
from server.audit import sha256_file


@dataclass(frozen=True)
class RecordedReplay:
    """A replay document of the run (replay.json, replay-attempt-NNN.json) that judged the approved kernel."""

    name: str
    sha256: str
    document: dict

    @property
    def decision(self) -> str:
        return self.document.get("decision", "?")


@dataclass(frozen=True)
class RunEvidence:
    """A run folder as an approval reads it."""

    dir: Path
    report: VerifyReport  # the folder's verification (ok, chain head, records, the run key's fingerprint)
    record: RunRecord
    entry: AttemptRecord  # the approved kernel's history.json entry
    replay: RecordedReplay | None  # None: no replay of this kernel in this state of the run

    @property
    def attempt(self) -> int:
        return self.record.kernel.attempt


def read_run(run_dir: Path, attempt: int | None = None) -> RunEvidence:
    """The run's evidence for its best (or `attempt`); RunFolderError where the folder lacks what an approval
    needs. The verification's problems are in `report`, for the caller to refuse or to force past."""
    run_dir = Path(run_dir)
    report = verify_run(run_dir)
    record = load_record(run_dir, attempt)
    entry = read_history(run_dir).attempt(record.kernel.attempt)
    if entry is None or not entry.valid:
        verdict = entry.verdict if entry is not None else "none"
        raise RunFolderError(f"attempt {record.kernel.attempt} was not judged valid (verdict {verdict}): "
                             "only a kernel the run accepted can be approved")
    return RunEvidence(run_dir, report, record, entry, _recorded_replay(run_dir, attempt, record, report))


def _recorded_replay(run_dir: Path, attempt: int | None, record: RunRecord, report: VerifyReport) -> RecordedReplay | None:
    path = run_dir / output_name(attempt)
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_bytes())
    except ValueError:
        return None
    kernel = document.get("kernel") or {}
    fresh = (document.get("run_chain_head") == report.head and kernel.get("attempt") == record.kernel.attempt
             and kernel.get("source_sha256") == record.kernel.describe()["source_sha256"])
    return RecordedReplay(path.name, sha256_file(path), document) if fresh else None


def replay_gpu(replay: RecordedReplay) -> str | None:
    return ((replay.document.get("environment") or {}).get("now") or {}).get("gpu")
