"""`guard --accept`: a passing guard run on a new environment becomes the approval's accepted baseline, signed
again, so that a driver, toolkit or GPU change is taken on knowingly instead of going stale.

Only a run where every case passed (or improved) and the environment differs from the approval's is accepted.
The new approval keeps the kernel, its baseline and the task (the same files, the same digests); its latencies
are this run's (every round's samples, the kernel's and the baseline's), each case's accepted ratio this run's
rounds' (their estimate and signed-rank interval, as approve measures it), its fingerprint this node's, and its
provenance says what was accepted and why. It is signed with a key the store trusts (guard/signing.py) and
replaces approval.json and the envelope, the envelope last: an interrupted accept leaves the old signature
over a changed approval.json, which the store check names.
"""

from __future__ import annotations

import getpass
from pathlib import Path

from guard.approval import AcceptedRatio, Approval, CaseLatency, RatioMeasurement, Statement
from guard.signing import ApprovalKeyError, key_id, load_private, sign, trusted_keys
from guard.step import StepResult
from guard.store import ENVELOPE, READABLE, LoadedApproval, keys_dir
from harness.stats import speedup
from server.audit import write_json_atomic
from server.run import now_iso

ACCEPTED = "accepted this run"


def accept(store: Path, loaded: LoadedApproval, result: StepResult, key: Path | None) -> str:
    """Accept the run if it may be; one line saying what was done, or why not."""
    name = loaded.name
    if not result.passed:
        return f"{name}: not accepted: only a run where every case passes is accepted"
    if not result.environment_changes:
        return f"{name}: nothing to accept: the environment is the approval's"
    if key is None:
        raise ApprovalKeyError("--accept signs the new baseline: give --key KEY or set $KERNEL_REFEREE_APPROVAL_KEY")
    private = load_private(key)
    if key_id(private.public_key()) not in trusted_keys(keys_dir(store)):
        raise ApprovalKeyError(f"the key {key} is not trusted by the store (its .pub is not in {keys_dir(store)})")
    approval = accepted_approval(loaded.approval, result)
    statement = Statement.of(approval)
    write_json_atomic(loaded.folder / READABLE, statement.to_json()["predicate"])
    write_json_atomic(loaded.folder / ENVELOPE, sign(statement.to_json(), private).model_dump(mode="json"))
    return f"{name}: {ACCEPTED} as the new baseline ({'; '.join(result.environment_changes)}), signed again"


def accepted_approval(before: Approval, result: StepResult) -> Approval:
    """The approval with this run's latencies and fingerprint, its provenance saying what was accepted."""
    kernel, baseline = result.latencies.get("candidate", {}), result.latencies.get("baseline", {})
    ratios = {v.case: AcceptedRatio(estimate=v.ratio.estimate, low=v.ratio.low, high=v.ratio.high,
                                    confidence=v.ratio.confidence, rounds=v.rounds_kept, set_aside=v.set_aside)
              for v in result.verdicts if v.ratio is not None}
    cases = [CaseLatency(case=case, kernel=stats, baseline=baseline.get(case),
                         speedup=speedup(baseline[case], stats) if case in baseline else None,
                         clock=(before.case(case).clock if before.case(case) else None), ratio=ratios.get(case))
             for case, stats in sorted(kernel.items())]
    measurement = RatioMeasurement(source="guard-rounds", rounds=max((r.rounds for r in ratios.values()), default=None),
                                   gpu=result.fingerprint.gpu, gpu_uuid=result.fingerprint.gpu_uuid,
                                   measured_at=now_iso(), why=f"the rounds of the guard run accepted on {result.node}")
    note = (f"accepted by `guard --accept` on {result.node} after a passing run on a new environment: "
            f"{'; '.join(result.environment_changes)}")
    provenance = before.provenance.model_copy(update={"approver": getpass.getuser(), "approved_at": now_iso(),
                                                      "note": note})
    return before.model_copy(update={"cases": cases, "fingerprint": result.fingerprint, "provenance": provenance,
                                     "ratio_measurement": measurement})
