"""A reviewer's decision on a finished run: replay it, approve it or reject it, each action in the run's audit log.

Approving is `kernel-referee approve` (guard/approve.py) with the service's own approval key: the run must verify
and a replay of its best must have said GO, and the signed approval lands in the service's guard store, whose
keys/ trusts that key. Each action is a REVIEWED record appended to the run's events.jsonl, signed with the run's
key as every record is, while the folder is held (server/folder_lock.py), so that `verify` still passes and the
review cannot be edited afterwards without breaking the chain.

Order matters: a recorded replay counts only for the chain head it saw (guard/run_evidence.py). So a replay's
request is logged before the replay runs, and an approval is logged after it is written, never between.
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import logging
import shutil
from pathlib import Path

from pydantic import BaseModel, Field

from guard.approve import EXIT_APPROVED, ApproveOptions, approve
from guard.signing import ApprovalKeyError, generate
from guard.store import approval_dir, check_name, keys_dir
from server.audit import AuditLog
from server.folder_lock import FolderLock
from server.records import EventKind
from server.replay import MakeExecutor, output_name, replay
from server.run import now_iso
from server.signed_log import run_key

KEY_NAME = "service-approver"
MAX_NOTE_CHARS = 2000
log = logging.getLogger(__name__)


class ReviewAction(str, enum.Enum):
    REPLAY = "replay"
    APPROVE = "approve"
    REJECT = "reject"


class ReviewEvent(BaseModel):
    """One reviewer action as the run's log holds it (the REVIEWED record's data)."""

    action: ReviewAction
    reviewer: str
    note: str = Field(default="", max_length=MAX_NOTE_CHARS)
    outcome: str                      # "requested", "approved", "refused", "rejected", or the replay's decision
    detail: str = ""                  # the refusal's reason, the approval's folder, the replay's output
    at: str = Field(default_factory=now_iso)


class ReviewRefused(Exception):
    """The action cannot be taken (approval refused by the guard, a run with no folder); the message says why."""


class Approver(BaseModel):
    """The service's approval key and the guard store that trusts it."""

    key: Path
    store: Path


def service_approver(root: Path) -> Approver:
    """ROOT/review/service-approver.key (made once) and ROOT/guard-store, its keys/ holding the key's .pub."""
    folder, store = root / "review", root / "guard-store"
    key = folder / f"{KEY_NAME}.key"
    if not key.exists():
        generate(folder, KEY_NAME)
    trusted = keys_dir(store) / f"{KEY_NAME}.pub"
    if not trusted.exists():
        trusted.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / f"{KEY_NAME}.pub", trusted)
    return Approver(key=key, store=store)


def append_review(run_dir: Path, event: ReviewEvent) -> dict:
    """The event as a signed REVIEWED record at the end of the run's log, the folder held while it is written."""
    with FolderLock.take(run_dir, f"review {run_dir.name}"):
        with AuditLog(run_dir / "events.jsonl", signer=run_key(run_dir)) as log:
            return log.append(EventKind.REVIEWED, event.model_dump(mode="json"))


def reviews(run_dir: Path) -> list[ReviewEvent]:
    """Every review action the run's log holds, oldest first."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line: the log's own repair deals with it
        if record.get("kind") == EventKind.REVIEWED:
            found.append(ReviewEvent.model_validate(record["data"]))
    return found


def replay_for_review(run_dir: Path, reviewer: str, make_executor: MakeExecutor | None, repeats: int = 3,
                      confine: bool = True) -> ReviewEvent:
    """Log the request, then replay the run's best (server/replay.py, writing RUN/replay.json); the outcome is
    the replay's decision, or the refusal it printed."""
    append_review(run_dir, ReviewEvent(action=ReviewAction.REPLAY, reviewer=reviewer, outcome="requested"))
    said, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(errors):
        replay(run_dir, said, repeats=repeats, confine=confine, make_executor=make_executor)
    document = run_dir / output_name(None)
    if not document.exists():
        raise ReviewRefused(errors.getvalue().strip() or "the replay wrote no document")
    decision = json.loads(document.read_text()).get("decision", "?")
    return ReviewEvent(action=ReviewAction.REPLAY, reviewer=reviewer, outcome=str(decision),
                       detail=said.getvalue()[-4000:])


def approval_name(task_name: str, run_id: str) -> str:
    return check_name(f"{task_name}-{run_id}"[:64])


def approve_run(run_dir: Path, approver: Approver, name: str, reviewer: str, note: str,
                make_executor: MakeExecutor | None = None) -> ReviewEvent:
    """The guard's approval of the run's best, signed with the service's key; logged whether made or refused (a
    failure the guard does not answer itself, its executor's or a bug's, is a refusal naming it, its traceback in
    the service's log)."""
    options = ApproveOptions(run=run_dir, store=approver.store, name=name, key=approver.key, note=note or None,
                             approver=reviewer, make_executor=make_executor)
    said, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            status = approve(options, said)
        except (FileExistsError, FileNotFoundError, ValueError, ApprovalKeyError) as exc:
            status, errors = -1, io.StringIO(str(exc))
        except Exception as exc:  # noqa: BLE001 - the review is logged all the same, as a refusal
            log.exception("the approval of %s failed", run_dir)
            status, errors = -1, io.StringIO(f"the approval failed: {type(exc).__name__}: {exc}")
    if status == EXIT_APPROVED:
        event = ReviewEvent(action=ReviewAction.APPROVE, reviewer=reviewer, note=note, outcome="approved",
                            detail=str(approval_dir(approver.store, name)))
    else:
        why = errors.getvalue().strip().removeprefix("kernel-referee approve: ") or "the guard refused it"
        event = ReviewEvent(action=ReviewAction.APPROVE, reviewer=reviewer, note=note, outcome="refused", detail=why)
    append_review(run_dir, event)
    return event


def reject_run(run_dir: Path, reviewer: str, note: str) -> ReviewEvent:
    event = ReviewEvent(action=ReviewAction.REJECT, reviewer=reviewer, note=note, outcome="rejected")
    append_review(run_dir, event)
    return event


def decision_of(events: list[ReviewEvent]) -> ReviewEvent | None:
    """The run's standing decision: its last approval made or rejection."""
    decided = [e for e in events if e.outcome in ("approved", "rejected")]
    return decided[-1] if decided else None
