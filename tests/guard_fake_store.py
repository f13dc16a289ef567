"""A signed approval store made directly from a shipped task and kernels carrying the fake executor's markers
(tests/fake_executor.py): what the guard command's CPU tests run, approvals accepted at chosen latencies."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from guard.approval import (Approval, ApprovedKernel, CaseLatency, Provenance, ReplayDecision, Statement,
                            TaskCopy)
from guard.fingerprint import Fingerprint, from_environment
from guard.signing import generate, load_private, sign
from guard.store import keys_dir, write_approval
from harness.settings import TimingSettings
from harness.stats import speedup, summarize
from harness.task import load_task
from tests.fake_executor import FakeExecutor

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "cases"
# Timing small enough for a CPU test: the fake's latencies are markers, its samples 50 a job whatever is asked.
FAST_TIMING = TimingSettings(warmups=1, iterations=10)


def kernel_with(task_name: str, marker: str | None) -> str:
    """The task's shipped initial kernel, with fake markers (space-separated), each in a comment (None: as shipped)."""
    source = (CASES / task_name / "initial.cu").read_text()
    return "".join(f"// fake: {m}\n" for m in (marker or "").split()) + source


def fake_fingerprint(task_name: str, **changes) -> Fingerprint:
    """What the guard captures on the fake executor's environment (guard/fingerprint.py), with `changes`."""
    task = load_task(CASES / task_name)
    return from_environment({**FakeExecutor(task).start(), **changes})


def new_store(root: Path) -> tuple[Path, Path]:
    """An empty store trusting a new key: (store, private key)."""
    store = root / "store"
    private, public, _ = generate(root / "keys", "approver")
    keys_dir(store).mkdir(parents=True)
    shutil.copy(public, keys_dir(store) / public.name)
    return store, private


def add_approval(store: Path, key: Path, name: str, task_name: str, accepted_us: float, now_us: float | None = None,
                 marker: str | None = None, fingerprint: Fingerprint | None = None, attempt: int = 1,
                 own_kernel: bool = False) -> None:
    """Approve the task's initial kernel accepted at `accepted_us` beside the shipped initial kernel (the fake's
    default 100 us); the approved source's marker makes it run at `now_us` (default: as accepted), plus `marker`.
    With `own_kernel`, the approved source is the baseline's itself; `attempt` is the number it is recorded as."""
    markers = " ".join(m for m in (f"latency_us={now_us or accepted_us:g}", marker) if m)
    baseline_source = kernel_with(task_name, None)
    files = {"kernel.cu": (baseline_source if own_kernel else kernel_with(task_name, markers)).encode(),
             "baseline.cu": baseline_source.encode()}
    task_dir = CASES / task_name
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        files[f"task/{path.relative_to(task_dir).as_posix()}"] = path.read_bytes()
    digests = {relative: hashlib.sha256(data).hexdigest() for relative, data in files.items()}
    task = load_task(task_dir)
    launch = task.own_launch("initial").model_dump(mode="json")
    cases = []
    for case in task.performance_cases:
        kernel, baseline = summarize([accepted_us / 1000] * 50), summarize([0.1] * 50)
        cases.append(CaseLatency(case=case.name, kernel=kernel, baseline=baseline, speedup=speedup(baseline, kernel),
                                 clock="events"))
    task_files = {k: v for k, v in digests.items() if k.startswith("task/")}
    approval = Approval(
        name=name, task=TaskCopy(name=task.name, files=task_files, sha256=hashlib.sha256("".join(
            f"{k} {v}\n" for k, v in sorted(task_files.items())).encode()).hexdigest()),
        kernel=ApprovedKernel(file="kernel.cu", sha256=digests["kernel.cu"], attempt=attempt, launch=launch),
        baseline=ApprovedKernel(file="baseline.cu", sha256=digests["baseline.cu"], attempt=0, launch=launch),
        cases=cases, timing=FAST_TIMING.model_dump(mode="json"), timing_rounds=2,
        fingerprint=fingerprint or fake_fingerprint(task_name),
        provenance=Provenance(run="run-001", task=task.name, chain_head="0" * 64, chain_records=3,
                              run_key_fingerprint=None, replay=ReplayDecision(decision="GO"), approver="tests",
                              approved_at="2026-12-06T00:00:00+00:00"))
    statement = Statement.of(approval)
    write_approval(store, statement, sign(statement.to_json(), load_private(key)), files)
