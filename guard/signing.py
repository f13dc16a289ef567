"""Approval keys and the DSSE envelope an approval's statement is signed in.

DSSE (github.com/secure-systems-lab/dsse, protocol.md): the signature covers PAE(payloadType, payload) =
"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, so neither the payload nor its type can be swapped.
The envelope is {"payload": base64(body), "payloadType": ..., "signatures": [{"keyid", "sig": base64}]}.
Keys are Ed25519 in PEM (PKCS#8 private, SubjectPublicKeyInfo public), readable by any in-toto tool; a
key's id is the sha256 of its raw 32-byte public key, in hex, as the run keys' fingerprints are
(server/keys.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from server.keys import fingerprint_of

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PRIVATE_SUFFIX, PUBLIC_SUFFIX = ".key", ".pub"


class ApprovalKeyError(Exception):
    """An approval key cannot be made, read or parsed."""


class EnvelopeError(Exception):
    """A DSSE envelope is malformed or its signature does not verify against a trusted key."""


class Envelope(BaseModel):
    """A DSSE envelope as stored (approval.dsse.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    payload: str  # base64 of the statement's JSON
    payloadType: str  # noqa: N815 - DSSE's name
    signatures: list[dict[str, str]]  # {"keyid": fingerprint, "sig": base64}


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def key_id(public: Ed25519PublicKey) -> str:
    return fingerprint_of(public.public_bytes_raw().hex())


def generate(folder: Path, name: str = "approver") -> tuple[Path, Path, str]:
    """A new key pair in `folder` (made 0700 where new): NAME.key (0600, never over another) and NAME.pub; the
    paths and the key's id."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    private_path, public_path = folder / f"{name}{PRIVATE_SUFFIX}", folder / f"{name}{PUBLIC_SUFFIX}"
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ApprovalKeyError(f"{private_path} exists: a key is never written over another") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public_path.write_bytes(public_pem(private.public_key()))
    return private_path, public_path, key_id(private.public_key())


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise ApprovalKeyError(f"{path}: not a readable Ed25519 private key in PEM ({e})") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ApprovalKeyError(f"{path}: not an Ed25519 key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise ApprovalKeyError(f"{path}: not a readable Ed25519 public key in PEM ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise ApprovalKeyError(f"{path}: not an Ed25519 key")
    return key


def trusted_keys(folder: Path) -> dict[str, Ed25519PublicKey]:
    """Every public key in `folder` (*.pub), by key id."""
    return {key_id(key): key for key in (load_public(p) for p in sorted(Path(folder).glob(f"*{PUBLIC_SUFFIX}")))}


def canonical(document: dict) -> bytes:
    """The statement's bytes: sorted keys, no spaces, so a signed payload is reproducible from its content."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(document: dict, private: Ed25519PrivateKey, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    body = canonical(document)
    signature = private.sign(pae(payload_type, body))
    return Envelope(payload=base64.b64encode(body).decode(), payloadType=payload_type,
                    signatures=[{"keyid": key_id(private.public_key()), "sig": base64.b64encode(signature).decode()}])


def open_envelope(envelope: Envelope, trusted: dict[str, Ed25519PublicKey],
                  payload_type: str = PAYLOAD_TYPE) -> tuple[dict, str]:
    """The verified payload and the id of the trusted key whose signature holds; EnvelopeError naming why not."""
    if envelope.payloadType != payload_type:
        raise EnvelopeError(f"payloadType is {envelope.payloadType!r}, not {payload_type!r}")
    try:
        body = base64.b64decode(envelope.payload, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError("payload is not base64") from None
    if not envelope.signatures:
        raise EnvelopeError("no signature")
    untrusted = []
    for entry in envelope.signatures:
        key = trusted.get(entry.get("keyid", ""))
        if key is None:
            untrusted.append(entry.get("keyid", "?"))
            continue
        try:
            key.verify(base64.b64decode(entry.get("sig", ""), validate=True), pae(envelope.payloadType, body))
        except (InvalidSignature, binascii.Error, ValueError):
            raise EnvelopeError(f"the signature of key {entry['keyid'][:16]}... does not verify: the payload or "
                                "its type changed after signing") from None
        try:
            return json.loads(body), entry["keyid"]
        except ValueError:
            raise EnvelopeError("the signed payload is not JSON") from None
    raise EnvelopeError(f"signed only by key(s) not trusted by the store: {', '.join(k[:16] + '...' for k in untrusted)}"
                        " (a trusted key's PEM goes in the store's keys/)")
