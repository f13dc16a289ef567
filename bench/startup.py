"""How long a new run takes to answer, on a GPU: `kernel-referee serve --task cases/matmul_f32` started as an MCP
client starts it (stdio), the time to its `initialize` answer (the server answers at once, the run is prepared
behind it: server/preparation.py), and the time to the first record_attempt that is answered rather than refused
as "preparing" (a client calling it again as told). Also the preparation's own time, as describe_task says it.

    python bench/startup.py [--repeat 3] [--json OUT] [--task FOLDER | --gemm N]

`--gemm N` measures on matmul_f32 with one performance case of N x N x N (KernelBench's level-1 square GEMM is
4096): a preparation long enough that a client which waited for it before `initialize` would give up.

Before the starts, the parts of a start are timed each in a fresh interpreter (`start_parts`): the interpreter
itself, importing the command line's modules, the GPU probe (a child of its own: harness/device.py) and NVML's list
of GPUs, so that an `initialize` over its bound names its cause.

Exits 2, printing "no GPU", on a machine without one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.device import gpu_absent_reason  # noqa: E402

MATMUL = ROOT / "cases" / "matmul_f32"
SERVE = "import sys; from server.entry import main; sys.exit(main())"
INITIALIZE_BOUND_S = 2.0


PARTS = {  # what each fresh interpreter imports first, then times (its own start is "interpreter")
    "imports": ("pass", "import server.cli"),
    "gpu_probe": ("from harness.device import gpu_absent_reason", "gpu_absent_reason()"),
    "nvml_list": ("from harness.gpus import list_gpus", "list_gpus()"),
}


def start_parts() -> dict[str, float]:
    """Seconds of each part of a server's start before `initialize`, each in a fresh interpreter."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], cwd=ROOT, check=True)
    parts = {"interpreter": round(time.monotonic() - began, 3)}
    for name, (first, code) in PARTS.items():
        timed = f"import time; {first}; t = time.monotonic(); {code}; print(time.monotonic() - t)"
        done = subprocess.run([sys.executable, "-c", timed], cwd=ROOT, check=True, capture_output=True, text=True)
        parts[name] = round(float(done.stdout.strip().splitlines()[-1]), 3)
    return parts


def gemm_task(folder: Path, n: int) -> Path:
    """matmul_f32 with its performance cases replaced by one of n x n x n (its correctness and holdout cases kept)."""
    shutil.copytree(MATMUL, folder)
    manifest = folder / "task.toml"
    text = manifest.read_text(encoding="utf-8")
    head, _, cases = text.partition("[[cases]]")
    kept = [block for block in ("[[cases]]" + c for c in cases.split("[[cases]]") if c.strip())
            if 'role = "performance"' not in block]
    square = (f'[[cases]]\nname = "square-{n}"\nrole = "performance"\ndims = {{ m = {n}, n = {n}, k = {n} }}\n'
              "seed = 2\n\n")
    manifest.write_text(head + kept[0] + square + "".join(kept[1:]), encoding="utf-8")
    return folder


async def one_start(results: Path, task: Path = MATMUL) -> dict:
    """One server's start: seconds to `initialize`, to the first answered record_attempt, and its preparation's."""
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), args=[
        "-c", SERVE, "serve", "--task", str(task), "--results", str(results), "--new-run"])
    started = time.monotonic()
    refusals = 0
    with open(results.parent / "server.err", "a") as errlog:
        async with Client(stdio_client(params, errlog=errlog), cache=None, read_timeout_seconds=300) as c:
            initialize_s = time.monotonic() - started
            first = (await c.call_tool("describe_task", {})).structured_content["preparation"]
            while True:
                result = await c.call_tool("record_attempt", {"source": (task / "initial.cu").read_text(),
                                                              "rationale": "startup bench: the baseline again"})
                text = result.content[0].text if result.content else ""
                if not (result.is_error and "preparing, ready in about" in text):
                    break
                refusals += 1
            attempt_s = time.monotonic() - started
            assert not result.is_error, text
            prepared = (await c.call_tool("describe_task", {})).structured_content["preparation"]
    return {"initialize_s": round(initialize_s, 3), "first_record_attempt_s": round(attempt_s, 3),
            "preparation_s": prepared["elapsed_s"], "preparing_refusals": refusals,
            "first_status": first, "verdict": result.structured_content["verdict"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--task", type=Path, default=MATMUL, help="the task folder (default cases/matmul_f32)")
    which.add_argument("--gemm", type=int, metavar="N", help="matmul_f32 with one N x N x N performance case")
    args = parser.parse_args()
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"no GPU to measure on: {absent}")
        return 2
    parts = start_parts()
    print("parts of a start, each alone: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()), flush=True)
    starts = []
    with tempfile.TemporaryDirectory() as scratch:
        task = gemm_task(Path(scratch) / f"matmul_f32_{args.gemm}", args.gemm) if args.gemm else args.task.resolve()
        print(f"task: {task.name}", flush=True)
        for index in range(args.repeat):
            start = anyio.run(one_start, Path(scratch) / "results", task)
            starts.append(start)
            print(f"start {index + 1}: initialize {start['initialize_s']:.2f} s, first record_attempt "
                  f"{start['first_record_attempt_s']:.1f} s (preparation {start['preparation_s']:.1f} s, "
                  f"{start['preparing_refusals']} 'preparing' answers), verdict {start['verdict']}", flush=True)
    worst = max(s["initialize_s"] for s in starts)
    summary = {"task": args.task.name if not args.gemm else f"matmul_f32, one {args.gemm}^3 performance case",
               "parts_s": parts, "starts": starts, "initialize_s_max": worst,
               "initialize_s_median": statistics.median(s["initialize_s"] for s in starts),
               "first_record_attempt_s_median": statistics.median(s["first_record_attempt_s"] for s in starts),
               "initialize_bound_s": INITIALIZE_BOUND_S, "within_bound": worst < INITIALIZE_BOUND_S}
    print(f"initialize: at most {worst:.2f} s (bound {INITIALIZE_BOUND_S:g} s); first record_attempt: median "
          f"{summary['first_record_attempt_s_median']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if summary["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
