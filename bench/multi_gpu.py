"""Several GPUs of one host, one run on each: does a run on GPU 0 time the same while the others are busy, and do
attempts per hour grow with the number of GPUs? Prints a table and writes multi_gpu.json.

    python bench/multi_gpu.py [--out DIR] [--task cases/matmul_f32] [--timings 5] [--seconds 120]

- isolation: the task's baseline timed on GPU 0 `--timings` times alone, then as many times while every other GPU
  serves a run of its own under real record_attempt load (a process per GPU running the referee's own path:
  new_run, then record_attempt in a loop). The medians agree when their difference is within the timing's own
  noise: the half-widths of the two medians' 95% intervals (harness/stats.py), added.
- throughput: attempts per hour of one loaded run on GPU 0 alone, then of one run on each of the N GPUs at once;
  the scaling is the second over the first, against N.

It needs two GPUs or more: with fewer it says so on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.gpus import list_gpus  # noqa: E402
from harness.placement import GpuInfo  # noqa: E402
from harness.settings import CompiledKernel, TimingSettings  # noqa: E402
from harness.task import load_task  # noqa: E402
from server.attempt import record_attempt  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.run import RunSettings  # noqa: E402

EXIT_TOO_FEW = 2
MATMUL = ROOT / "cases" / "matmul_f32"


def too_few_gpus(gpus: list[GpuInfo]) -> str | None:
    """The one-line refusal on a host of fewer than two GPUs; None where the bench can run."""
    if len(gpus) >= 2:
        return None
    return (f"bench/multi_gpu.py needs two GPUs or more on one host; NVML lists {len(gpus)} here "
            "(run it on a multi-GPU machine)")


def load(task_dir: Path, gpu_uuid: str, results: Path, seconds: float) -> dict:
    """One run on one GPU under record_attempt load for `seconds`: its attempts and their wall time."""
    gpu = next(g for g in list_gpus() if g.uuid == gpu_uuid)
    executor = GpuExecutor(load_task(task_dir), TimingSettings(), lease_what=f"bench load {gpu.index}", gpu=gpu)
    run = new_run(task_dir, results, RunSettings(max_attempts=999), executor)
    source = run.task.source("initial")
    print("ready", flush=True)  # the run exists: its load starts now
    started, attempts = time.monotonic(), 0
    try:
        while time.monotonic() - started < seconds and run.attempts_used < run.settings.max_attempts:
            attempts += 1  # a new comment each time: a new compile, as an agent's next attempt
            record_attempt(run, run.candidate(None, f"{source}\n// attempt {attempts}\n"), "bench load", None, None)
        return {"gpu": gpu.index, "attempts": attempts, "seconds": round(time.monotonic() - started, 3)}
    finally:
        run.close()
        executor.close()


def start_loads(task_dir: Path, gpus: list[GpuInfo], out: Path, seconds: float) -> list[subprocess.Popen]:
    """A load process per GPU, returned once every one has made its run (the baseline timed) and begun its load."""
    loads = [subprocess.Popen([sys.executable, __file__, "--load", g.uuid, "--task", str(task_dir), "--seconds",
                               str(seconds), "--out", str(out / f"load-{g.index}")], stdout=subprocess.PIPE, text=True)
             for g in gpus]
    for process in loads:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a load process did not start its run (status {process.wait()})")
    return loads


def finished(loads: list[subprocess.Popen]) -> list[dict]:
    done = []
    for process in loads:
        stdout, _ = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"a load process on a GPU failed with status {process.returncode}")
        done.append(json.loads(stdout.strip().splitlines()[-1]))
    return done


def timed_medians(task_dir: Path, gpu: GpuInfo, timings: int) -> list[tuple[float, float]]:
    """(median score in ms, its relative 95% half-width) of the baseline timed `timings` times on `gpu`."""
    task = load_task(task_dir)
    executor = GpuExecutor(task, TimingSettings(), lease_what="bench multi-gpu", gpu=gpu)
    try:
        executor.start()
        compiled = executor.compile(task.source("initial"), ())
        kernel = CompiledKernel("initial", compiled.cubin, compiled.lowered_name, task.own_launch("initial"))
        cases = list(task.performance_cases)
        results = []
        for _ in range(timings):
            report = executor.time(kernel, cases)
            noise = max((c.median_rel_halfwidth or 0.0) for c in report.cases)
            results.append((report.score_ms, noise))
        return results
    finally:
        executor.close()


def isolation(alone: list[tuple[float, float]], loaded: list[tuple[float, float]]) -> dict:
    a, b = statistics.median(m for m, _ in alone), statistics.median(m for m, _ in loaded)
    noise = statistics.median(n for _, n in alone) + statistics.median(n for _, n in loaded)
    difference = b / a - 1
    return {"alone_ms": a, "loaded_ms": b, "difference": difference, "noise": noise, "agree": abs(difference) <= noise}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--task", type=Path, default=MATMUL)
    parser.add_argument("--timings", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--load", help=argparse.SUPPRESS)  # a load process: this GPU's UUID
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    if args.load:
        print(json.dumps(load(args.task, args.load, out, args.seconds)), flush=True)
        return 0
    gpus = list_gpus()
    refusal = too_few_gpus(gpus)
    if refusal:
        print(refusal, file=sys.stderr)
        return EXIT_TOO_FEW
    first, others = gpus[0], gpus[1:]
    alone = timed_medians(args.task, first, args.timings)
    loads = start_loads(args.task, others, out / "isolation", args.seconds)
    try:
        loaded = timed_medians(args.task, first, args.timings)
    finally:
        finished(loads)
    one = finished(start_loads(args.task, [first], out / "one", args.seconds))
    every = finished(start_loads(args.task, gpus, out / "every", args.seconds))
    document = {"gpus": [g.uuid for g in gpus], "isolation": isolation(alone, loaded),
                "attempts_per_hour_one_gpu": _per_hour(one), "attempts_per_hour_all_gpus": _per_hour(every)}
    document["scaling"] = document["attempts_per_hour_all_gpus"] / document["attempts_per_hour_one_gpu"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "multi_gpu.json").write_text(json.dumps(document, indent=2))
    _print(document, len(gpus))
    return 0


def _per_hour(loads: list[dict]) -> float:
    return sum(3600 * d["attempts"] / d["seconds"] for d in loads)


def _print(document: dict, count: int) -> None:
    i = document["isolation"]
    print(f"GPU 0 alone: {i['alone_ms']:.4f} ms; others busy: {i['loaded_ms']:.4f} ms; difference "
          f"{i['difference']:+.2%} against noise {i['noise']:.2%}: {'agree' if i['agree'] else 'DIFFER'}")
    print(f"attempts per hour: 1 GPU {document['attempts_per_hour_one_gpu']:.0f}, {count} GPUs "
          f"{document['attempts_per_hour_all_gpus']:.0f} ({document['scaling']:.2f}x against {count}x)")


if __name__ == "__main__":
    sys.exit(main())
