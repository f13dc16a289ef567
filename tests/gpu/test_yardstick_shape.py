"""A yardstick at two paces, on the GPU: a task whose own kernel pads about 45% of its launches (the two-mode
exploit kernel at the task's 16 x 16 launch, its pads halved) still makes a run. Its timing is taken as measured,
the shape's reason kept in history.json (`shape_waived`); an honest attempt is timed beside it; the same kernel
sent as an attempt, the kernel being judged, is refused for its shape."""

import json
import shutil
from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from server.attempt import record_attempt
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import RunSettings
from tests.test_cli import MATMUL

pytestmark = pytest.mark.gpu
EXPLOITS = Path(__file__).parents[1] / "exploits"
TILED32 = {"grid": ["ceil_div(n, 32)", "ceil_div(m, 32)"], "block": [32, 32]}
SHAPE = {"timing_modes", "timing_spread"}  # two groups, or spread wider than honest kernels


def test_a_two_paced_task_kernel_is_a_yardstick_and_the_same_kernel_as_an_attempt_is_refused(tmp_path):
    task_dir = tmp_path / "matmul_two_paced"
    shutil.copytree(MATMUL, task_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # At 16 x 16 tiles a pad of six tenths of a block's work makes a padded launch about 2.1 times a fast one
    # (H100, 2026-12-07), and the mean passes 1.5 times the median: uneven_launches, which no yardstick is taken
    # past. Three tenths keep the two paces parted well beyond MODE_GAP and the mean well under 1.5 times the median.
    source = (EXPLOITS / "two_mode_timing.cu").read_text()
    two_paced = source.replace("#define TILE 32", "#define TILE 16").replace("worked * 6 / 10", "worked * 3 / 10")
    assert "#define TILE 16" in two_paced and "worked * 3 / 10" in two_paced
    (task_dir / "initial.cu").write_text(two_paced)
    timing = TimingSettings(warmups=5, iterations=40, run_deadline_s=5)
    executor = GpuExecutor(load_task(task_dir), timing, compile_deadline_s=10)
    settings = RunSettings(max_attempts=3, compiles_per_minute=10_000, timing=timing)
    try:
        run = new_run(task_dir, tmp_path / "results", settings, executor)  # before: refused, timing_modes
        try:
            honest = record_attempt(run, run.candidate(None, (EXPLOITS / "correct_control.cu").read_text(), None,
                                                       TILED32), "honest 32 x 32 tiles", None, None)
            paced = record_attempt(run, run.candidate(None, two_paced), "the task's own kernel as an attempt",
                                   None, None)
        finally:
            run.close()
    finally:
        executor.close()

    attempts = json.loads((run.dir / "history.json").read_text())["attempts"]
    baseline = attempts[0]
    assert baseline["verdict"] == "baseline"
    waived = [row["shape_waived"]["candidate"] for row in baseline["timing"].values() if row.get("shape_waived")]
    assert waived, baseline["timing"]  # its two paces were seen, and taken as measured
    assert all(r.split(":")[0] in SHAPE for reasons in waived for r in reasons), waived
    assert honest.verdict in ("valid-faster", "valid-not-faster"), honest.reasons
    rows = attempts[1]["timing"].values()
    assert not any("candidate" in row.get("shape_waived", {}) for row in rows), attempts[1]  # judged, and passed
    beside = [row["shape_waived"]["baseline"] for row in rows if row.get("shape_waived")]
    assert beside and all(r.split(":")[0] in SHAPE for reasons in beside for r in reasons), attempts[1]
    assert paced.verdict == "rejected", paced
    assert paced.reasons and {r.code.value for r in paced.reasons} <= SHAPE | {"uneven_launches"}, paced.reasons
