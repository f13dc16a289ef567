"""The approval store's check: DSSE envelopes of in-toto statements signed with Ed25519, verified here and by an
independent implementation (securesystemslib), and every tampering refused, naming what changed."""

from __future__ import annotations

import base64
import copy
import json
import shutil

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from guard.approval import PREDICATE_TYPE, Statement
from guard.cli import main
from guard.signing import (PAYLOAD_TYPE, Envelope, EnvelopeError, generate, load_private, open_envelope, pae, sign,
                           trusted_keys)
from guard.store import ENVELOPE, READABLE, StoreRefused, approval_dir, changed_fields, keys_dir, load_store
from server.audit import sha256_file
from tests.approval_support import NAME, approved, good_run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One approval of a real CPU run: (the store, the approver's private key)."""
    root = tmp_path_factory.mktemp("approval")
    code, store, key, out = approved(root, good_run(root))
    assert code == 0, out
    return store, key


@pytest.fixture
def store(made, tmp_path):
    """A copy of the made store, for a test to tamper with."""
    return shutil.copytree(made[0], tmp_path / "store")


def folder(store):
    return approval_dir(store, NAME)


def envelope_of(store) -> dict:
    return json.loads((folder(store) / ENVELOPE).read_text())


def refusal(store) -> list[tuple[str, str, str]]:
    with pytest.raises(StoreRefused) as refused:
        load_store(store)
    return [(p.approval, p.what, p.detail) for p in refused.value.problems]


def test_an_envelope_signs_and_opens_and_any_changed_byte_fails(tmp_path):
    private = load_private(generate(tmp_path)[0])
    trusted = {k: v for k, v in trusted_keys(tmp_path).items()}
    envelope = sign({"a": 1, "b": [2, 3]}, private)
    assert open_envelope(envelope, trusted)[0] == {"a": 1, "b": [2, 3]}
    assert pae("t", b"xy") == b"DSSEv1 1 t 2 xy"
    changed = envelope.model_copy(update={"payload": base64.b64encode(b'{"a":2,"b":[2,3]}').decode()})
    with pytest.raises(EnvelopeError, match="does not verify"):
        open_envelope(changed, trusted)
    with pytest.raises(EnvelopeError, match="payloadType"):
        open_envelope(envelope.model_copy(update={"payloadType": "application/json"}), trusted)
    with pytest.raises(EnvelopeError, match="not trusted by the store"):
        open_envelope(envelope, {})


def test_the_store_verifies_and_an_independent_dsse_implementation_agrees(made):
    store, _ = made
    [loaded] = load_store(store)
    document = envelope_of(store)
    [pem] = list(keys_dir(store).glob("*.pub"))
    key = SSlibKey.from_crypto(load_pem_public_key(pem.read_bytes()), keyid=loaded.key_id)
    envelope = SslibEnvelope.from_dict(copy.deepcopy(document))  # from_dict takes the signatures apart
    assert list(envelope.verify([key], 1)) == [loaded.key_id]
    statement = json.loads(envelope.payload)
    assert envelope.payload_type == PAYLOAD_TYPE
    assert statement["_type"] == "https://in-toto.io/Statement/v1" and statement["predicateType"] == PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert {"kernel.cu", "baseline.cu", "task/task.toml", "task/reference.cu"} <= set(subjects)
    assert all(sha256_file(folder(store) / name) == digest for name, digest in subjects.items())
    assert statement["predicate"] == json.loads((folder(store) / READABLE).read_text())
    document["payload"] = base64.b64encode(envelope.payload.replace(b'"matmul_f32"', b'"matmul_f64"')).decode()
    with pytest.raises(VerificationError):
        SslibEnvelope.from_dict(document).verify([key], 1)


def test_an_edited_kernel_is_refused_naming_it(store):
    path = folder(store) / "kernel.cu"
    path.write_text(path.read_text() + "\n// slower now\n")
    [(name, what, detail)] = refusal(store)
    assert (name, what) == (NAME, "kernel.cu") and detail.startswith("changed (sha256 ")


def test_an_edited_task_file_is_refused_naming_it(store):
    path = folder(store) / "task/task.toml"
    path.write_text(path.read_text().replace("tolerance", "tolerance ", 1))
    assert [(w, d.split(" ")[0]) for _, w, d in refusal(store)] == [("task/task.toml", "changed")]


def test_a_removed_or_added_file_is_refused_naming_it(store):
    (folder(store) / "baseline.cu").unlink()
    (folder(store) / "task/extra.cu").write_text("// added\n")
    assert sorted(w + ": " + d for _, w, d in refusal(store)) == [
        "baseline.cu: missing", "task/extra.cu: added (not part of the signed approval)"]


def test_a_file_replaced_by_a_link_is_refused(store, tmp_path):
    outside = tmp_path / "kernel.cu"
    outside.write_bytes((folder(store) / "kernel.cu").read_bytes())
    (folder(store) / "kernel.cu").unlink()
    (folder(store) / "kernel.cu").symlink_to(outside)
    assert [(w, d) for _, w, d in refusal(store)] == [("kernel.cu", "replaced by a symbolic link")]


def test_an_edited_approval_field_is_refused_naming_the_field(store):
    readable = json.loads((folder(store) / READABLE).read_text())
    readable["cases"][0]["kernel"]["median_ms"] *= 1.5
    readable["provenance"]["note"] = "looser"
    (folder(store) / READABLE).write_text(json.dumps(readable))
    [(_, what, detail)] = refusal(store)
    assert what == READABLE
    assert detail == "differs from the signed approval in cases[0].kernel.median_ms, provenance.note"


def test_a_rewritten_statement_in_the_envelope_is_refused_as_its_signature(store):
    document = envelope_of(store)
    statement = json.loads(base64.b64decode(document["payload"]))
    statement["predicate"]["cases"][0]["kernel"]["median_ms"] *= 1.5
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (folder(store) / ENVELOPE).write_text(json.dumps(document))
    [(_, what, detail)] = refusal(store)
    assert what == "signature" and "does not verify" in detail


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(payloadType="application/json"), "payloadType is 'application/json'"),
    (lambda d: d.update(signatures=[]), "no signature"),
    (lambda d: d.update(payload="%%%"), "payload is not base64"),
    (lambda d: d.pop("signatures"), "not a DSSE envelope"),
])
def test_a_broken_envelope_is_refused_naming_why(store, change, says):
    document = envelope_of(store)
    change(document)
    (folder(store) / ENVELOPE).write_text(json.dumps(document))
    [(_, _, detail)] = refusal(store)
    assert says in detail


def test_an_approval_signed_by_a_key_the_store_does_not_trust_is_refused(store, tmp_path):
    statement = Statement.model_validate(json.loads(base64.b64decode(envelope_of(store)["payload"])))
    stranger = load_private(generate(tmp_path / "stranger")[0])
    (folder(store) / ENVELOPE).write_text(sign(statement.to_json(), stranger).model_dump_json())
    [(_, what, detail)] = refusal(store)
    assert what == "key" and "not trusted by the store" in detail


def test_a_store_whose_trusted_key_was_removed_refuses_its_approvals(store):
    for pem in keys_dir(store).glob("*.pub"):
        pem.unlink()
    assert {w for _, w, _ in refusal(store)} == {"keys", "key"}


def test_a_renamed_approval_folder_is_refused(store):
    folder(store).rename(approval_dir(store, "renamed"))
    [(name, what, _)] = refusal(store)
    assert (name, what) == ("renamed", "name")


def test_only_names_an_approval_the_store_lacks(store):
    with pytest.raises(StoreRefused, match="nope: approval: not in the store"):
        load_store(store, ["nope"])
    assert [a.name for a in load_store(store, [NAME])] == [NAME]


def test_the_guard_command_exits_2_on_a_store_that_does_not_verify(store, capsys):
    path = folder(store) / "kernel.cu"
    path.write_text(path.read_text() + "// changed\n")
    assert main(["guard", str(store)]) == 2
    err = capsys.readouterr().err
    assert "the store does not verify" in err and f"{NAME}: kernel.cu: changed" in err


def test_changed_fields_names_dotted_paths():
    assert changed_fields({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"b": 2, "c": [1, 3]}, "e": 1}) == [
        "a.b", "a.c[1]", "d", "e"]
    assert changed_fields([1], [1, 2]) == ["(the whole document)"]
