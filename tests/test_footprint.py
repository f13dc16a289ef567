"""Cases too large for the GPU are refused by name before anything is made."""

from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.footprint import CONTEXT_RESERVE_BYTES, case_bytes, shortfalls, timing_bytes
from harness.jobs import Layout
from harness.worker_side.buffers import GUARD_BYTES
from harness.task import load_task
from server.lifecycle import new_run
from server.run import RunSettings, TaskDoesNotFit
from tests.fake_executor import FakeExecutor

SAXPY = Path(__file__).parent / "fixtures" / "tasks" / "saxpy"
H200 = {"total_memory_bytes": 150_754_820_096, "l2_bytes": 62_914_560}
H100 = {"total_memory_bytes": 85_520_809_984, "l2_bytes": 52_428_800}


def huge_saxpy(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "saxpy"
    folder.mkdir()
    for f in SAXPY.iterdir():
        text = f.read_text()
        if f.name == "task.toml":
            text = text.replace("dims = { n = 16777216 }", f"dims = {{ n = {n} }}")
        (folder / f.name).write_text(text)
    return folder


def test_timing_needs_every_set_with_its_guards_and_the_snapshots():
    task = load_task(SAXPY)
    settings = TimingSettings()
    case = next(c for c in task.cases if c.name == "large")
    n = 16777216
    layout = Layout.for_case(task, case.dims)
    # each 64 MiB array with its guard bands and the 2 MiB of slack that aligns it
    # and two counters per timed launch (unwritten elements, changed drawn inputs), one per snapshot
    expected = 4 * 3 * (4 * n + 2 * GUARD_BYTES + (2 << 20)) + 3 * 4 * n + 8 * (2 * 100 + 3)
    assert timing_bytes(layout, settings) == expected == case_bytes(task, case, settings)
    odd = next(c for c in task.cases if c.name == "odd")
    assert case_bytes(task, odd, settings) == 3 * (4 * 1001 + 2 * GUARD_BYTES)


def test_a_shipped_task_fits_and_a_huge_case_is_named(tmp_path):
    assert shortfalls(load_task(SAXPY), TimingSettings(), H200) == []
    # 2^31 floats = 8 GiB per array: one set fits, but timing holds 4 sets and 3 snapshots (120 GiB): more
    # than an 80 GB GPU offers, less than an H200's.
    task = load_task(huge_saxpy(tmp_path, 2**31 - 1))
    assert shortfalls(task, TimingSettings(), H200) == []
    (problem,) = shortfalls(task, TimingSettings(), H100)
    assert problem.startswith("case large needs 120.0 GiB of device memory (4 input sets and 3 output snapshots")
    assert f"offers {(H100['total_memory_bytes'] - 2 * H100['l2_bytes'] - CONTEXT_RESERVE_BYTES) / 2**30:.1f} GiB" \
        in problem


def test_a_device_that_does_not_say_its_size_is_not_refused(tmp_path):
    assert shortfalls(load_task(huge_saxpy(tmp_path, 2**31 - 1)), TimingSettings(), {"gpu": "x"}) == []


class _SmallGpu(FakeExecutor):
    def start(self) -> dict:
        return {**super().start(), "total_memory_bytes": 4 * 2**30, "l2_bytes": 50 * 2**20}


def test_a_run_of_a_task_that_does_not_fit_is_refused_before_any_folder_is_made(tmp_path):
    folder = huge_saxpy(tmp_path, 2**28)  # 1 GiB per array: 16 GiB to time
    results = tmp_path / "results"
    with pytest.raises(TaskDoesNotFit, match="case large needs"):
        new_run(folder, results, RunSettings(), _SmallGpu(load_task(folder)))
    assert not results.exists() or not any(results.iterdir())
