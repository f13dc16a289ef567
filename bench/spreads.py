"""How widely honest kernels' timed launches spread, measured on a GPU: the numbers behind the timing's shape
rule (harness/timing_shape.py, docs/timing.md).

    python bench/spreads.py [--out DIR] [--runs 3] [--tasks NAME...]

Times, each in `--runs` independent jobs (a new worker each), every performance case of every shipped task
(or of `--tasks`) with its initial and reference kernel, the reference also under the candidates' launch where
the task gives it its own and it is right under that one too (a run whose baseline is the reference times it so),
and the demo's matmul_f32 kernels, with the referee's own protocol.
Writes spreads.json: for each kernel and case, every run's per-launch samples and its shape (harness/timing_shape.py
`shape_of`), then prints the widest shapes seen. Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.device import gpu_absent_reason  # noqa: E402
from harness.settings import CompiledKernel, TimingSettings  # noqa: E402
from harness.task import load_task  # noqa: E402
from harness.task_model import LaunchSpec  # noqa: E402
from harness.timing_shape import shape_of  # noqa: E402
from server.demo import PLAN  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402

CASES = ROOT / "cases"


def kernels_of(executor: GpuExecutor, task_name: str) -> list[tuple[str, CompiledKernel]]:
    """The task's initial and reference kernels, and for matmul_f32 the demo's kernels that compile and pass."""
    task = executor.task
    found = []
    for which in ("initial", "reference"):
        result = executor.compile(task.source(which), ())
        if not result.ok:
            raise RuntimeError(f"{task_name} {which} does not compile:\n{result.log}")
        found.append((f"{task_name} {which}", CompiledKernel(which, result.cubin, result.lowered_name,
                                                            task.own_launch(which))))
        if which == "reference" and task.own_launch("reference") != task.launch:
            # A run whose baseline is the reference times it under the candidates' launch, where it is right so.
            as_candidate = CompiledKernel(which, result.cubin, result.lowered_name, task.launch)
            checked = executor.check(as_candidate, list(task.visible_cases))
            if checked.passed:
                found.append((f"{task_name} reference as a candidate", as_candidate))
            else:
                codes = ", ".join(sorted({r.code for r in checked.reasons}))
                print(f"  {task_name} reference as a candidate: left out, wrong under the candidates' launch "
                      f"({codes}): no run can have it as its baseline", flush=True)
    if task_name == "matmul_f32":
        for step in PLAN:
            result = executor.compile(step.source, step.options)
            if result.ok and "bug" not in step.label:
                found.append((f"demo {step.label}", CompiledKernel(step.label, result.cubin, result.lowered_name,
                                                                  LaunchSpec.model_validate(step.launch))))
    return found


def measure(task_name: str, runs: int) -> list[dict]:
    executor = GpuExecutor(load_task(CASES / task_name), TimingSettings(), lease_what="bench")
    executor.start()
    rows = []
    try:
        for label, kernel in kernels_of(executor, task_name):
            for run in range(runs):
                executor.fresh_worker()
                for timing in executor.time(kernel, list(executor.task.performance_cases)).cases:
                    rows.append({"kernel": label, "case": timing.case, "run": run, "passed": timing.passed,
                                 "median_ms": timing.stats.median_ms if timing.stats else None,
                                 "reasons": [r.code for r in timing.reasons] if hasattr(timing, "reasons") else [],
                                 "samples_ms": list(timing.samples_ms)})
            print(f"  {label}: {runs} runs", flush=True)
    finally:
        executor.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", metavar="NAME", help="only these shipped tasks (default: every one)")
    args = parser.parse_args()
    unknown = sorted(set(args.tasks or ()) - {p.name for p in CASES.iterdir() if (p / "task.toml").exists()})
    if unknown:
        parser.error(f"no shipped task named {', '.join(unknown)}")
    absent = gpu_absent_reason()
    if absent:
        print(f"no GPU: {absent}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": []}
    for task_dir in sorted(p for p in CASES.iterdir() if (p / "task.toml").exists()
                           and (not args.tasks or p.name in args.tasks)):
        for row in measure(task_dir.name, args.runs):
            row["shape"] = shape_of(row["samples_ms"]).model_dump(mode="json") if row["samples_ms"] else None
            document["rows"].append(row)
        (args.out / "spreads.json").write_text(json.dumps(document))  # after each task: a cut run keeps what it has
    print(f"wrote {args.out / 'spreads.json'}: {len(document['rows'])} timings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
