"""`kernel-referee guard` on the GPU, the real GpuExecutor: the best of a real played run, approved with a key made
by `keygen`, passes unchanged; a copy about 3% slower is regressed; a copy wrong on one element is incorrect; the
guard step costs at most twice its timing's GPU time. One approval, the copies made from it (guard/variants.py)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from guard import variants
from guard.cli import main
from guard.measure import local_executor
from guard.run import GuardOptions, run_guard
from guard.step import guard_approval
from guard.store import keys_dir, load_approval
from guard.verdict import Verdict, VerdictSettings
from harness.task import load_task
from tests.gpu.test_replay import run_dir  # noqa: F401 - the fixture: a real finished run of matmul_f32

pytestmark = pytest.mark.gpu
APPROVED = "matmul-tiled"
# The verdict's defaults, its bound on repeats lowered: the GPU time of the file stays small.
SETTINGS = VerdictSettings(max_rounds=24)
PREMISE = (0.015, 0.06)  # the slowdown a "3% slower" copy must have made for its verdict to mean anything


@pytest.fixture(scope="module")
def approved(run_dir, tmp_path_factory):  # noqa: F811
    """(store, private key): the run's best approved into a store trusting a key made by `keygen`."""
    root = tmp_path_factory.mktemp("guard")
    assert main(["keygen", str(root / "keys")]) == 0
    store = root / "store"
    keys_dir(store).mkdir(parents=True)
    shutil.copy(root / "keys" / "approver.pub", keys_dir(store))
    (run_dir / "replay.json").unlink(missing_ok=True)  # approve makes its own replay on this GPU
    assert main(["approve", str(run_dir), "--store", str(store), "--name", APPROVED, "--key",
                 str(root / "keys" / "approver.key"), "--repeats", "2"]) == 0
    return store, root / "keys" / "approver.key"


def guard(store: Path, name: str) -> tuple[int, dict, str]:
    """`guard STORE --only NAME --json FILE` through guard.run on this GPU: its exit, its JSON and its output."""
    out, path = io.StringIO(), store.parent / "out" / f"{name}.json"
    code = run_guard(GuardOptions(store=store, only=[name], json=path, settings=SETTINGS), out)
    return code, json.loads(path.read_text()), out.getvalue()


def test_an_unchanged_approval_passes_and_its_guard_step_costs_at_most_twice_its_timing(approved):
    store, _ = approved
    # approve measured the accepted ratios the guard holds its runs to here, in 32 interleaved rounds per case
    approval = load_approval(store, APPROVED).approval
    assert approval.ratio_measurement.source == "guard-rounds" and {c.ratio.rounds for c in approval.cases} == {32}
    code, document, out = guard(store, APPROVED)
    assert code == 0, out
    assert [v["verdict"] for v in document["results"][0]["verdicts"]] == ["pass", "pass"], out
    # A run after the first (the compile cache and the GPU warm): the step's whole wall time against its timing's.
    result = guard_approval(load_approval(store, APPROVED), local_executor(APPROVED), SETTINGS)
    assert result.passed, [(v.case, v.verdict, v.reason) for v in result.verdicts]
    cost = result.cost
    assert cost.rounds >= SETTINGS.min_rounds and cost.timing_s > 0
    assert cost.ratio <= 2.0, cost


def test_a_copy_about_3_percent_slower_is_regressed(approved):
    store, key = approved
    loaded = load_approval(store, APPROVED)
    blocks = variants.case_blocks(loaded)
    plan = variants.spin_plan(loaded)
    task_name = loaded.approval.provenance.task
    for attempt in (1, 2):  # the formula's plan, then once rescaled from what it measured
        name = f"{APPROVED}-slower-{attempt}"
        source = variants.slower(loaded.source("kernel.cu"), load_task(loaded.path("task")).kernel_name, plan)
        variants.copy_with(store, loaded, name, source, key, f"about 3% slower ({task_name}), to rehearse the guard")
        code, document, out = guard(store, name)
        verdicts = document["results"][0]["verdicts"]
        added = {v["case"]: v["change"]["estimate"] - 1 for v in verdicts if v["change"]}
        if len(added) == len(blocks) and all(PREMISE[0] <= a <= PREMISE[1] for a in added.values()):
            break
        assert added, out  # every case timed: a rescale has something to start from
        plan = variants.recalibrated(plan, blocks, added)
    assert len(added) == len(blocks) and all(PREMISE[0] <= a <= PREMISE[1] for a in added.values()), (added, plan)
    assert code == 1, out
    assert [v["verdict"] for v in verdicts] == [Verdict.REGRESSED.value] * len(blocks), out


def test_a_copy_wrong_on_one_element_is_incorrect_and_not_timed(approved):
    store, key = approved
    loaded = load_approval(store, APPROVED)
    task = load_task(loaded.path("task"))
    source = variants.one_wrong_element(loaded.source("kernel.cu"), task)
    variants.copy_with(store, loaded, f"{APPROVED}-wrong", source, key, "one wrong element, to rehearse the guard")
    code, document, out = guard(store, f"{APPROVED}-wrong")
    assert code == 1, out
    verdicts = document["results"][0]["verdicts"]
    assert verdicts and {v["verdict"] for v in verdicts} == {Verdict.INCORRECT.value}, out
    assert all(v["rounds"] == 0 for v in verdicts)
    assert "FAIL " in out and "mismatch" in out
