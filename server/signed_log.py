"""A run's key from outside a serving process, and the signed list of its derived files.

report.html, heatmap.svg, heatmap.png and the replay documents are derived from the run's records and
written after them (at the end of the run, by `kernel-referee report`, by `kernel-referee replay`), as
often as a person likes; the audit log is left as it was. Each such write signs `derived.json`: every
derived file present with its sha256, signed with the run's key, and `verify` holds the folder to it
(none added, none changed, none removed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from server import keys
from server.audit import canonical_json, sha256_file, write_json_atomic
from server.lock import read_lock
from server.run import RunSettings

DERIVED_NAMES = ("report.html", "heatmap.svg", "heatmap.png")
REPLAY_GLOB = "replay*.json"  # replay.json, replay-attempt-NNN.json (server/replay.py)
MANIFEST = "derived.json"


def derived_files(run_dir: Path) -> dict[str, str]:
    """The derived files in a run folder, by name, with their sha256."""
    run_dir = Path(run_dir)
    names = [n for n in DERIVED_NAMES if (run_dir / n).is_file()]
    names += sorted(p.name for p in run_dir.glob(REPLAY_GLOB) if p.is_file())
    return {name: sha256_file(run_dir / name) for name in names}


def is_derived(relative: str) -> bool:
    return relative in DERIVED_NAMES or ("/" not in relative and Path(relative).match(REPLAY_GLOB))


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


def manifest_digest(files: dict[str, str]) -> str:
    """What derived.json's signature signs: the sha256 of its file list in canonical form."""
    return hashlib.sha256(canonical_json({"files": files})).hexdigest()


def sign_derived(run_dir: Path) -> None:
    """Write derived.json for the derived files now in the run folder, signed with the run's key (nothing for a
    run made before signing). Raises keys.SigningKeyError where that key cannot be read here."""
    run_dir = Path(run_dir)
    if not (run_dir / "lock.json").is_file():
        return  # no run yet: nothing to sign with
    key = run_key(run_dir)
    if key is None:
        return
    files = derived_files(run_dir)
    write_json_atomic(run_dir / MANIFEST, {"files": files, "sig": key.sign(manifest_digest(files))})


def read_manifest(run_dir: Path) -> dict | None:
    """derived.json ({files, sig}), or None where there is none or it is not one."""
    try:
        manifest = json.loads((Path(run_dir) / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    ok = (isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)
          and isinstance(manifest.get("sig"), str))
    return manifest if ok else None


@dataclass(frozen=True)
class DerivedDifference:
    """The derived files in a run folder against derived.json: `listed`, whether there is one; `signed`, whether
    its signature is the run key's; the files it lists that are gone, those whose sha256 differs, those it does not
    list (all of them where there is none)."""

    listed: bool
    signed: bool
    removed: list[str]
    differing: list[str]
    unlisted: list[str]

    @property
    def names(self) -> set[str]:
        return {*self.removed, *self.differing, *self.unlisted}


def derived_difference(run_dir: Path, public_hex: str) -> DerivedDifference:
    """The folder's derived files against its derived.json, whose signature must be `public_hex`'s."""
    manifest, present = read_manifest(run_dir), derived_files(run_dir)
    if manifest is None:
        return DerivedDifference(False, False, [], [], list(present))
    listed = manifest["files"]
    signed = keys.public_checker(public_hex)(manifest_digest(listed), manifest["sig"])
    return DerivedDifference(True, signed, [name for name in listed if name not in present],
                             [name for name, digest in listed.items() if name in present and present[name] != digest],
                             [name for name in present if name not in listed])
