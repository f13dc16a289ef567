"""A case as large as the GPU allows, through the whole referee: cases/softmax_f32 with its performance cases
replaced by a 4096 x 393216 float32 softmax (6.4 GB each way), whose reference accumulates in double
(bench/kernels/softmax_long_rows.cu). A new run (its expected outputs, its baseline), then
record_attempt calls through the MCP layer, each timed against the 55 s a tool call has; the host memory of
the parent and of both GPU workers at their peak; the run folder's size; and whether the large case was
judged on the device.

    python bench/large_case.py [--attempts 2] [--json OUT] [--results DIR]

Without a GPU it says so and exits 0 with no numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.call_limits import CALL_DEADLINE_S  # noqa: E402
from harness.device import gpu_absent_reason  # noqa: E402
from harness.settings import TimingSettings  # noqa: E402
from harness.task import load_task  # noqa: E402
from server.app import build_server  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.run import RunSettings  # noqa: E402

SOFTMAX = ROOT / "cases" / "softmax_f32"
LONG_ROWS = {"rows": 4096, "cols": 393216}


def long_softmax_task(folder: Path) -> Path:
    """cases/softmax_f32 in `folder`, its performance cases one 4096 x 393216 case, its reference one block of
    1024 threads per row accumulating in double (the shipped one-thread-per-row reference would take seconds a
    launch, and its float sum over 393216 terms would not hold the tolerance)."""
    shutil.copytree(SOFTMAX, folder)
    shutil.copy(ROOT / "bench" / "kernels" / "softmax_long_rows.cu", folder / "reference.cu")
    manifest = folder / "task.toml"
    text = manifest.read_text().replace('name = "softmax_f32"\ndescription', 'name = "softmax_long_rows"\ndescription', 1)
    text = re.sub(r'# One thread per row.\n\[reference_launch\]\ngrid = \[[^]]*\]\nblock = \[[^]]*\]',
                  '# One block of 1024 threads per row (bench/kernels/softmax_long_rows.cu).\n'
                  '[reference_launch]\ngrid = ["rows", 1, 1]\nblock = [1024, 1, 1]', text)
    text = re.sub(r'name = "square-4096"\nrole = "performance"\ndims = \{[^}]*\}',
                  f'name = "long-{LONG_ROWS["rows"]}x{LONG_ROWS["cols"]}"\nrole = "performance"\n'
                  f'dims = {{ rows = {LONG_ROWS["rows"]}, cols = {LONG_ROWS["cols"]} }}', text)
    text = re.sub(r'\n\[\[cases\]\]\nname = "rows-16384x1024"\nrole = "performance"\ndims = \{[^}]*\}\nseed = [0-9]+\n', "\n", text)
    manifest.write_text(text)
    return folder


def peak_rss_bytes(pid: int | None) -> int | None:
    """A live process's peak resident memory (VmHWM), or None."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


async def attempts(run, count: int) -> list[dict]:
    source = run.task.source("initial")
    timed = []
    async with Client(build_server(run), cache=None) as client:
        for number in range(count):
            started = time.monotonic()
            result = await client.call_tool("record_attempt", {"source": source, "rationale": f"bench {number}"})
            seconds = time.monotonic() - started
            answer = result.structured_content or {}
            timed.append({"seconds": seconds, "error": result.content[0].text if result.is_error else None,
                          "verdict": answer.get("verdict"), "within_call": seconds < CALL_DEADLINE_S})
    return timed


def measure(task_dir: Path, results: Path, count: int) -> dict:
    task = load_task(task_dir)
    settings = RunSettings(timing=TimingSettings())
    executor = GpuExecutor(task, settings.timing)
    try:
        started = time.monotonic()
        run = new_run(task_dir, results, settings, executor)
        made_s = time.monotonic() - started
        try:
            calls = anyio.run(attempts, run, count)
        finally:
            run.close()
        referee = executor.referee
        pool = executor.pool
        return {
            "task": task.name, "gpu": executor.facts.get("gpu") if executor.facts else None,
            "new_run_s": made_s, "record_attempt": calls,
            "host_peak_bytes": {"parent": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                "reference_worker": peak_rss_bytes(pool.reference.pid),
                                "candidate_worker": peak_rss_bytes(pool.candidate.pid)},
            "run_folder_bytes": folder_bytes(run.dir),
            "judged_on_device": referee.judged_on_device, "audits_on_device": referee.audits_on_device,
            "device_off": referee.device_off}
    finally:
        executor.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2, help="record_attempt calls after the run is made")
    parser.add_argument("--results", type=Path, help="where the run goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"no GPU to measure on: {absent}")
        return 0
    with tempfile.TemporaryDirectory(prefix="large-case-") as tmp:
        task_dir = long_softmax_task(Path(tmp) / "task")
        numbers = measure(task_dir, args.results or Path(tmp) / "results", args.attempts)
    print(json.dumps(numbers, indent=2))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
