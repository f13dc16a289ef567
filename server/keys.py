"""A run's Ed25519 signing key: made when the run is made, used by its audit log to sign every record.

The public key and its fingerprint stand in lock.json and the run's first record, and are printed when
the run is made and in `finish`'s answer, so that a person holds the anchor outside the run folder
(`kernel-referee verify --public-key FINGERPRINT`). The private key is kept in the run folder
(`signing.key`, mode 0600) or, with `serve --key-dir DIR`, in DIR as FINGERPRINT.key, out of the run
folder: docs/security.md ("The audit log") says what each defends against.

`cryptography` is imported here only, when a key is made, loaded or checked.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

KEY_FILE = "signing.key"  # the private key's name in a run folder made without --key-dir
KEY_SUFFIX = ".key"  # in a key folder: FINGERPRINT.key


class SigningKeyError(Exception):
    """A run's private key cannot be found, read or made."""


def fingerprint_of(public_hex: str) -> str:
    """The sha256 of the raw 32-byte public key, in hex: what a person keeps and passes to verify."""
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()


class RunKey:
    """A run's private key, able to sign a record's hash."""

    def __init__(self, private_raw: bytes):
        self.private_raw = private_raw
        self._private = _private(private_raw)  # parsed once: the log signs every record with it
        self.public_hex = self._private.public_key().public_bytes_raw().hex()
        self.fingerprint = fingerprint_of(self.public_hex)

    def sign(self, record_hash: str) -> str:
        """The signature of a record's 32-byte hash (which covers the record and, through prev, every one before)."""
        return self._private.sign(bytes.fromhex(record_hash)).hex()

    def anchor(self) -> dict:
        """What lock.json and the first record hold of the key: the public half and its fingerprint."""
        return {"algorithm": "ed25519", "public_key": self.public_hex, "fingerprint": self.fingerprint}


def public_checker(public_hex: str):
    """A check of record signatures against one public key (parsed once: a log holds thousands of records)."""
    from cryptography.exceptions import InvalidSignature  # only where a key is used
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # only where a key is used

    key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))

    def holds(record_hash: str, signature_hex: str) -> bool:
        try:
            key.verify(bytes.fromhex(signature_hex), bytes.fromhex(record_hash))
        except (InvalidSignature, ValueError):
            return False
        return True

    return holds


def _private(raw: bytes):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # only where a key is used

    return Ed25519PrivateKey.from_private_bytes(raw)


def key_path(run_dir: Path, key_dir: Path | None, fingerprint: str) -> Path:
    """Where a run's private key lives: in its folder, or in the key folder under its fingerprint."""
    return Path(key_dir) / f"{fingerprint}{KEY_SUFFIX}" if key_dir is not None else Path(run_dir) / KEY_FILE


def check_key_dir(key_dir: Path) -> None:
    """A key folder must exist and be closed to every other user: a key another user can read protects nothing."""
    try:
        mode = os.stat(key_dir).st_mode
    except OSError as e:
        raise SigningKeyError(f"--key-dir {key_dir}: {e.strerror or e}") from e
    if not os.path.isdir(key_dir):
        raise SigningKeyError(f"--key-dir {key_dir} is not a folder")
    if mode & 0o077:
        raise SigningKeyError(f"--key-dir {key_dir} is open to other users (mode {mode & 0o777:o}); "
                        f"`chmod 700 {key_dir}` and run the referee as a user the agent is not")


def create_key(run_dir: Path, key_dir: Path | None) -> RunKey:
    """A new key for the run in `run_dir`, its private half written (0600, never over another) where
    `key_path` says."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # only where a key is used

    if key_dir is not None:
        check_key_dir(key_dir)
    key = RunKey(Ed25519PrivateKey.generate().private_bytes_raw())
    path = key_path(run_dir, key_dir, key.fingerprint)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (key.private_raw.hex() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise SigningKeyError(f"the run's signing key could not be written to {path}: {e.strerror or e}") from e
    return key


def load_key(run_dir: Path, key_dir: Path | None, fingerprint: str) -> RunKey:
    """The private key of the run whose lock names `fingerprint`, from its folder or the key folder."""
    path = key_path(run_dir, key_dir, fingerprint)
    try:
        raw = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as e:
        where = f"the key folder {key_dir}" if key_dir is not None else "the run folder"
        raise SigningKeyError(f"the run's signing key ({fingerprint[:16]}...) is not readable in {where}: {e}; "
                        "a run made with --key-dir needs the same --key-dir") from e
    key = RunKey(raw)
    if key.fingerprint != fingerprint:
        raise SigningKeyError(f"{path} holds another key ({key.fingerprint[:16]}...), "
                              f"not the run's ({fingerprint[:16]}...)")
    return key
