"""The approval store: a plain folder a team keeps in git, and the one check every reader of it goes through.

    STORE/keys/*.pub                      trusted approval keys (Ed25519, PEM); only these may sign
    STORE/approvals/NAME/approval.dsse.json   the signed statement (DSSE envelope, guard/signing.py)
    STORE/approvals/NAME/approval.json    the approval as readable JSON, for review; held to the signed one
    STORE/approvals/NAME/kernel.cu        the approved kernel
    STORE/approvals/NAME/baseline.cu      the kernel it is timed beside
    STORE/approvals/NAME/task/...         the task, copied from the run
    STORE/history/NAME.jsonl              the guard's runs (guard/history.py); not part of the approval

`load_store` verifies every approval before anything is measured: the envelope's signature by a trusted key,
the statement's form, its subjects against the approval's files, every file's sha256, no file added, and
approval.json against the signed predicate. A store that does not verify raises StoreRefused, whose problems
name the approval and what changed in it (the guard exits 2).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from guard.approval import Approval, Statement
from guard.signing import ApprovalKeyError, Envelope, EnvelopeError, open_envelope, trusted_keys
from server.audit import sha256_file, write_bytes_atomic, write_json_atomic

KEYS, APPROVALS, HISTORY = "keys", "approvals", "history"
ENVELOPE, READABLE = "approval.dsse.json", "approval.json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Problem(BaseModel):
    """One thing of an approval that does not verify."""

    model_config = ConfigDict(frozen=True)

    approval: str  # its name ("" for the store itself)
    what: str  # the file or the part that changed: kernel.cu, task/reference.cu, approval.json, signature, key
    detail: str

    def __str__(self) -> str:
        return f"{self.approval + ': ' if self.approval else ''}{self.what}: {self.detail}"


class StoreRefused(Exception):
    """The store does not verify: an approval's signature, digests or files do not match."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class LoadedApproval:
    """A verified approval: its folder, its predicate and the key that signed it."""

    name: str
    folder: Path
    approval: Approval
    key_id: str

    def path(self, relative: str) -> Path:
        return self.folder / relative

    def source(self, relative: str) -> str:
        return self.path(relative).read_text()


def keys_dir(store: Path) -> Path:
    return Path(store) / KEYS


def approval_dir(store: Path, name: str) -> Path:
    return Path(store) / APPROVALS / name


def history_path(store: Path, name: str) -> Path:
    return Path(store) / HISTORY / f"{name}.jsonl"


def check_name(name: str) -> str:
    """An approval's name is a folder and a file name: letters, digits, '.', '_', '-'."""
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an approval name (letters, digits, '.', '_', '-'; at most 64)")
    return name


def approval_names(store: Path) -> list[str]:
    folder = Path(store) / APPROVALS
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def load_store(store: Path, only: list[str] | None = None) -> list[LoadedApproval]:
    """Every approval of the store (or those named in `only`), verified; StoreRefused with every problem found."""
    store = Path(store)
    try:
        trusted = trusted_keys(keys_dir(store))
    except ApprovalKeyError as e:
        raise StoreRefused([Problem(approval="", what=KEYS, detail=str(e))]) from None
    names = approval_names(store)
    problems = [Problem(approval=n, what="approval", detail=f"not in the store ({store / APPROVALS})")
                for n in only or () if n not in names]
    if not trusted:
        problems.append(Problem(approval="", what=KEYS, detail=f"no trusted key in {keys_dir(store)} (*.pub)"))
    if not names and not only:
        problems.append(Problem(approval="", what=APPROVALS, detail=f"no approval in {store / APPROVALS}"))
    loaded = []
    for name in names if only is None else [n for n in names if n in only]:
        found, wrong = _verified(store, name, trusted)
        problems += wrong
        if found is not None:
            loaded.append(found)
    if problems:
        raise StoreRefused(problems)
    return loaded


def load_approval(store: Path, name: str) -> LoadedApproval:
    """One approval, verified (StoreRefused naming what changed)."""
    return load_store(store, [name])[0]


def _verified(store: Path, name: str, trusted: dict) -> tuple[LoadedApproval | None, list[Problem]]:
    folder = approval_dir(store, name)

    def problem(what: str, detail: str) -> tuple[None, list[Problem]]:
        return None, [Problem(approval=name, what=what, detail=detail)]

    try:
        envelope = Envelope.model_validate_json((folder / ENVELOPE).read_bytes())
    except OSError as e:
        return problem(ENVELOPE, f"unreadable ({e.strerror or e})")
    except ValidationError as e:
        return problem(ENVELOPE, f"not a DSSE envelope ({e.error_count()} errors: {e.errors()[0]['msg']})")
    try:
        payload, key = open_envelope(envelope, trusted)
    except EnvelopeError as e:
        return problem("signature" if "trusted" not in str(e) else "key", str(e))
    try:
        statement = Statement.model_validate(payload)
    except ValidationError as e:
        return problem("statement", f"signed, but not an approval statement: {e.errors()[0]['loc']}: "
                                    f"{e.errors()[0]['msg']}")
    approval = statement.predicate
    problems = [Problem(approval=name, what=what, detail=detail) for what, detail in _content_problems(
        folder, name, statement, payload)]
    return (None if problems else LoadedApproval(name, folder, approval, key)), problems


def _content_problems(folder: Path, name: str, statement: Statement, payload: dict) -> list[tuple[str, str]]:
    """What of the approval's folder differs from its signed statement."""
    approval = statement.predicate
    problems = []
    if approval.name != name:
        problems.append(("name", f"the signed approval is named {approval.name!r}: its folder was renamed or copied"))
    subjects = {s.name: s.digest.get("sha256") for s in statement.subject}
    if subjects != approval.files():
        problems.append(("statement", "its subjects are not the approval's files"))
    for relative, digest in sorted(approval.files().items()):
        path = folder / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            problems.append((relative, "names a file outside the approval's folder"))
        elif path.is_symlink():
            problems.append((relative, "replaced by a symbolic link"))
        elif not path.is_file():
            problems.append((relative, "missing"))
        elif sha256_file(path) != digest:
            problems.append((relative, f"changed (sha256 {sha256_file(path)[:16]}..., approved {digest[:16]}...)"))
    known = set(approval.files()) | {ENVELOPE, READABLE}
    problems += [(p.relative_to(folder).as_posix(), "added (not part of the signed approval)")
                 for p in sorted(folder.rglob("*")) if not p.is_dir() and p.relative_to(folder).as_posix() not in known]
    problems += _readable_problems(folder, payload["predicate"])
    return problems


def _readable_problems(folder: Path, signed: dict) -> list[tuple[str, str]]:
    try:
        readable = json.loads((folder / READABLE).read_bytes())
    except OSError:
        return [(READABLE, "missing")]
    except ValueError:
        return [(READABLE, "not JSON")]
    changed = changed_fields(signed, readable)
    return [(READABLE, f"differs from the signed approval in {', '.join(changed[:8])}"
             + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))] if changed else []


def changed_fields(before: Any, after: Any, prefix: str = "") -> list[str]:
    """The dotted paths where two JSON values differ (a list's items by index)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after), key=str):
            found += changed_fields(before.get(key), after.get(key), f"{prefix}.{key}" if prefix else str(key))
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [f for i, (b, a) in enumerate(zip(before, after)) for f in changed_fields(b, a, f"{prefix}[{i}]")]
    return [] if before == after else [prefix or "(the whole document)"]


def write_approval(store: Path, statement: Statement, envelope: Envelope, files: dict[str, bytes]) -> Path:
    """The approval's folder, made anew: its files, approval.json and the envelope (written last, so a folder
    interrupted before it does not verify). Refuses an existing approval of that name."""
    approval = statement.predicate
    folder = approval_dir(store, check_name(approval.name))
    if folder.exists():
        raise FileExistsError(f"{folder} exists: an approval is replaced knowingly (remove it first, in git)")
    folder.mkdir(parents=True)
    for relative, data in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(folder / relative, data)
    write_json_atomic(folder / READABLE, statement.to_json()["predicate"])
    write_json_atomic(folder / ENVELOPE, envelope.model_dump(mode="json"))
    return folder
