"""A run's signed log from outside a serving process, and the record of its derived files.

report.html, heatmap.svg, heatmap.png and the replay documents are written after the run's records (at the
end of the run, by `kernel-referee report`, by `kernel-referee replay`), so no file_written record covers
them; after each such write a `report_written` record lists every derived file present with its sha256,
and `verify` holds the folder to the last one (none added, none changed, none removed).
"""

from __future__ import annotations

from pathlib import Path

from server import keys
from server.audit import LOG_NAME, AuditLog, sha256_file
from server.lock import read_lock
from server.records import EventKind
from server.run import RunSettings

DERIVED_NAMES = ("report.html", "heatmap.svg", "heatmap.png")
REPLAY_GLOB = "replay*.json"  # replay.json, replay-attempt-NNN.json (server/replay.py)


def derived_files(run_dir: Path) -> dict[str, str]:
    """The derived files in a run folder, by name, with their sha256."""
    run_dir = Path(run_dir)
    names = [n for n in DERIVED_NAMES if (run_dir / n).is_file()]
    names += sorted(p.name for p in run_dir.glob(REPLAY_GLOB) if p.is_file())
    return {name: sha256_file(run_dir / name) for name in names}


def is_derived(relative: str) -> bool:
    return relative in DERIVED_NAMES or (("/" not in relative) and Path(relative).match(REPLAY_GLOB))


def locked_anchor(run_dir: Path) -> dict | None:
    """The signing key lock.json names ({algorithm, public_key, fingerprint}); None for a run made before signing."""
    anchor = read_lock(run_dir).get("signing_key")
    return anchor if isinstance(anchor, dict) and isinstance(anchor.get("fingerprint"), str) else None


def run_key(run_dir: Path, key_dir: Path | None = None) -> keys.RunKey | None:
    """The private key of the run in `run_dir` (from `key_dir`, else where the run was told to keep it); None
    for a run made before signing. Raises keys.SigningKeyError where the run has a key this user cannot read."""
    anchor = locked_anchor(run_dir)
    if anchor is None:
        return None
    if key_dir is None:
        key_dir = RunSettings.of_run(run_dir).key_dir
    return keys.load_key(run_dir, key_dir, anchor["fingerprint"])


def record_derived(audit: AuditLog, run_dir: Path) -> dict:
    """Append the record that lists the derived files now in the run folder."""
    return audit.append(EventKind.REPORT_WRITTEN, {"files": derived_files(run_dir)})


def record_derived_outside(run_dir: Path) -> None:
    """`record_derived` for a command that holds the run folder but not its log (report, replay): the log is
    opened with the run's key. Raises keys.SigningKeyError where that key cannot be read."""
    with AuditLog(Path(run_dir) / LOG_NAME, signer=run_key(run_dir)) as audit:
        record_derived(audit, run_dir)
