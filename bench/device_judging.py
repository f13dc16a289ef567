"""How fast outputs are judged on the device: the judging kernels (harness/worker_side/judge_source.py) comparing
a candidate's two runs with an expected output, and hashing one (sha256-tree), per output size and dtype, in
bytes of output per second. Runs in this process, on GPU 0, with the worker's own code (no sandbox: the
kernels are the referee's, not a candidate's).

    python bench/device_judging.py [--gib 0.25 1 4] [--repeats 5] [--json OUT]

Without a GPU it says so and exits 0 with no numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.device import gpu_absent_reason  # noqa: E402
from harness.output_digest import double_of_bits  # noqa: E402
from harness.task_model import DTYPES  # noqa: E402
from harness.worker_side import gpu  # noqa: E402
from harness.worker_side.compile_policy import arch_for  # noqa: E402
from harness.worker_side.device_judging import Judges  # noqa: E402
from harness.worker_side.judge_source import JUDGE_SOURCE  # noqa: E402
from harness.worker_side.nvrtc import compile_kernel  # noqa: E402


def _seconds(work, repeats: int) -> float:
    """The median wall time of `work` (which synchronizes), after one unmeasured run."""
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


TILE_BYTES = 64 << 20
# Per dtype: tolerances a few units in the last place wide, so that outputs one unit off pass.
TOLERANCES = {"float32": (1e-5, 1e-6), "bfloat16": (3e-2, 1e-3), "float16": (4e-3, 1e-4), "float64": (1e-12, 1e-14)}


# The candidate's runs: the expected bits exactly (a kernel that computes as the reference does), each element one
# unit in the last place away (another order of the same sums: none passes bit for bit, all within tolerance), or
# each element about 2**(2**k) times too large (a wrong kernel: every element a mismatch, the slowest path).
RUNS = ("equal", "one-ulp-off", "all-wrong")
POISONS = (0xFFFFFFFF, 0x7F7F7F7F)  # never an element of the runs above: nothing counts as unwritten


def _outputs(context, buffers: list, dtype: str, nbytes: int, runs: str) -> None:
    """Expected: normal random values; both runs as `runs` says, tiled over the arrays."""
    dt = DTYPES[dtype]
    values = np.random.default_rng(0).standard_normal(TILE_BYTES // dt.itemsize).astype(dt)
    step = {"equal": 0, "one-ulp-off": 1, "all-wrong": 1 << (8 * dt.itemsize - 4)}[runs]  # all-wrong: in the exponent
    near = (values.view(f"u{dt.itemsize}") + step).view(np.uint8)
    tile = min(TILE_BYTES, nbytes)
    for allocation, host in zip(buffers, (values.view(np.uint8), near, near)):
        gpu.upload(allocation.ptr, host[:tile])
        for offset in range(tile, nbytes, tile):
            gpu.copy(allocation.ptr + offset, allocation.ptr, min(tile, nbytes - offset), context.stream)
    context.synchronize()


def measure(sizes_gib: list[float], dtypes: list[str], repeats: int) -> dict:
    context = gpu.Context(0)
    compiled = compile_kernel(JUDGE_SOURCE, "referee_judge_float32", arch=arch_for(*context.info.compute_capability))
    if not compiled.ok:
        raise RuntimeError(compiled.log)
    judges = Judges(context, compiled.cubin)
    rows = []
    for gib in sizes_gib:
        nbytes = int(gib * (1 << 30)) // 16 * 16
        buffers = [gpu.Allocation(nbytes) for _ in range(3)]
        try:
            for dtype, runs in ((d, r) for d in dtypes for r in RUNS):
                _outputs(context, buffers, dtype, nbytes, runs)
                elements = nbytes // DTYPES[dtype].itemsize
                expected, first, second = (a.ptr for a in buffers)
                rtol, atol = TOLERANCES[dtype]

                def judge():
                    return judges.judge(dtype, expected, first, second, elements, rtol, atol, POISONS)

                judge_s = _seconds(judge, repeats)
                totals = judge()
                if totals["mismatches"] != (elements if runs == "all-wrong" else 0) or totals["unwritten"] or \
                        totals["pair_differ_bits"] or (totals["max_abs_bits"] == 0) != (runs == "equal"):
                    raise RuntimeError(f"{dtype}, {runs}: not the outputs the bench meant to judge: {totals}")
                rows.append({"dtype": dtype, "runs": runs, "output_bytes": nbytes, "judge_s": judge_s,
                             "judge_output_gbps": nbytes / judge_s / 1e9,
                             "max_rel_error": double_of_bits(totals["max_rel_bits"])})
            hash_s = _seconds(lambda: judges.tree_sha256(buffers[0].ptr, nbytes), repeats)
            rows.append({"dtype": "bytes", "output_bytes": nbytes, "tree_sha256_s": hash_s,
                         "tree_sha256_gbps": nbytes / hash_s / 1e9})
        finally:
            for allocation in buffers:
                allocation.free()
    return {"device": context.info.name, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="+", default=[0.25, 1.0, 4.0], help="output sizes, GiB")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"no GPU to measure on: {absent}")
        return 0
    numbers = measure(args.gib, args.dtypes, args.repeats)
    for row in numbers["rows"]:
        if "judge_s" in row:
            print(f"{row['dtype']:>9} {row['runs']:>11} {row['output_bytes'] / 2**30:6.2f} GiB  judged in "
                  f"{row['judge_s'] * 1e3:8.2f} ms"
                  f"  = {row['judge_output_gbps']:7.0f} GB/s of output")
        else:
            print(f"{'sha256':>9} {'':>11} {row['output_bytes'] / 2**30:6.2f} GiB  hashed in {row['tree_sha256_s'] * 1e3:8.2f} ms"
                  f"  = {row['tree_sha256_gbps']:7.0f} GB/s")
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
