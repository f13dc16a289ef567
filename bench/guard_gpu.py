"""The guard's numbers on this host's GPU: runs of unchanged approvals raise no regression, a copy about 3% slower
is flagged regressed, a copy wrong on one element is flagged incorrect, and what a guard step costs beside its
timing.

    python bench/guard_gpu.py --out guard-gpu.json [--runs 20 | --quick] [--no-sandbox] [--work DIR]

Two real played runs are approved with a fresh key (kernel-referee approve, its own replay on this GPU): the
demo's best (matmul_f32's tiled kernel over the naive reference as baseline) and softmax_f32's initial kernel
over its reference. Then `--runs` guard steps each (guard/step.py, the real GpuExecutor, the verdict's
defaults) of: both unchanged approvals; a copy of the demo's best about 3% slower (guard/variants.py: its spin
planned from the approval, rescaled once from a first measurement when that lands outside 1.5% to 6%); a copy
wrong on one element. Writes JSON to --out after every guard step (`complete` false until the last) and prints a summary;
an interrupt (a slot's end) keeps what was measured. Exits 2 saying "no GPU" where there is none.
`--quick`: 2 runs of each, for a short GPU slot. `--work DIR` keeps the key, the approvals and every guard step
(steps.jsonl) in DIR, and a later run with the same DIR goes on from there: the 20 runs over several calls, each
cut at its slot's end, on one machine or (DIR carried) on another board of the same GPU model; the summary counts
the steps each board measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guard import variants  # noqa: E402
from guard.cli import main as guard_cli  # noqa: E402
from guard.measure import local_executor  # noqa: E402
from guard.signing import generate  # noqa: E402
from guard.step import StepResult, guard_approval  # noqa: E402
from guard.store import keys_dir, load_approval  # noqa: E402
from guard.verdict import VerdictSettings, exit_status  # noqa: E402
from harness.device import gpu_absent_reason  # noqa: E402
from harness.nvml import Nvml  # noqa: E402
from harness.settings import TimingSettings  # noqa: E402
from harness.task import load_task  # noqa: E402
from server.attempt import finish, record_attempt  # noqa: E402
from server.audit import sha256_file, write_bytes_atomic  # noqa: E402
from server.executor import GpuExecutor  # noqa: E402
from server.lifecycle import new_run  # noqa: E402
from server.lock import digest, referee_source  # noqa: E402
from server.run import RunSettings  # noqa: E402

CASES = ROOT / "cases"
PREMISE = (0.015, 0.06)  # the slowdown the "3% slower" copy must make for its runs to count
TIMING = TimingSettings(warmups=5, iterations=40)  # the played runs' protocol, which the approvals keep


def played_run(root: Path, task_name: str, baseline_file: str, attempt_file: str, confine: bool) -> Path:
    """A finished run of the task with `baseline_file` as its baseline and `attempt_file` as attempt 1."""
    task_dir = root / f"{task_name}-run"
    shutil.copytree(CASES / task_name, task_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (task_dir / "initial.cu").write_text((CASES / task_name / baseline_file).read_text())
    executor = GpuExecutor(load_task(task_dir), TIMING, confine=confine)
    try:
        run = new_run(task_dir, root / "results", RunSettings(max_attempts=3, timing=TIMING), executor)
        try:
            record_attempt(run, run.candidate(None, (CASES / task_name / attempt_file).read_text()), "try 1", None, None)
            finish(run, "done", None)
        finally:
            run.close()
    finally:
        executor.close()
    return run.dir


def step(store: Path, name: str, confine: bool, settings: VerdictSettings) -> StepResult:
    return guard_approval(load_approval(store, name), local_executor(name, confine), settings)


def summary_of(results: list[StepResult]) -> dict:
    """Exit statuses, verdicts per case, rounds, slowdowns measured, the step's cost over its timing, the steps
    each board (GPU UUID) measured and the yardstick timings taken past their shape."""
    later = [r.cost.ratio for r in results[1:] if r.cost.ratio is not None]
    return {"runs": len(results), "exit_status": dict(Counter(exit_status(r.verdicts) for r in results)),
            "verdicts": {case: dict(Counter(v.verdict.value for r in results for v in r.verdicts if v.case == case))
                         for case in dict.fromkeys(v.case for r in results for v in r.verdicts)},
            "rounds": [r.cost.rounds for r in results],
            "change": [{v.case: v.change.estimate for v in r.verdicts if v.change} for r in results],
            "cost_ratio_after_first": {"median": statistics.median(later), "max": max(later)} if later else None,
            "seconds": [round(r.cost.total_s, 2) for r in results],
            "boards": dict(Counter(str(r.fingerprint.gpu_uuid) for r in results)),
            # per kernel: the rounds whose timing of it, a yardstick's, was taken past its launches' shape
            "shape_waived": dict(Counter(label for r in results for label, per_case in r.shape_waived.items()
                                         for reasons in per_case.values() for _ in reasons))}


def slower_copy(store: Path, key: Path, name: str, confine: bool, settings: VerdictSettings) -> tuple[str, dict]:
    """The copy about 3% slower, and what its first measurement showed (rescaled once if outside the premise)."""
    loaded = load_approval(store, name)
    kernel_name, blocks = load_task(loaded.path("task")).kernel_name, variants.case_blocks(loaded)
    plan, shown = variants.spin_plan(loaded), {}
    for attempt in (1, 2):
        copy = f"{name}-slower-{attempt}"
        variants.copy_with(store, loaded, copy, variants.slower(loaded.source("kernel.cu"), kernel_name, plan), key,
                           "about 3% slower, to rehearse the guard")
        first = step(store, copy, confine, settings)
        added = {v.case: v.change.estimate - 1 for v in first.verdicts if v.change}
        shown[copy] = {"plan": plan, "added": added}
        if added and all(PREMISE[0] <= a <= PREMISE[1] for a in added.values()) and len(added) == len(blocks):
            return copy, shown
        plan = variants.recalibrated(plan, blocks, added) if added else plan
    return copy, shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("--runs", type=int, default=20, help="guard steps per approval and copy (default 20)")
    parser.add_argument("--quick", action="store_true", help="2 runs each, for a short GPU slot")
    parser.add_argument("--no-sandbox", action="store_true", help="run the workers unconfined")
    parser.add_argument("--work", type=Path, help="keep the approvals and every guard step in this folder, and go on "
                        "from what a run cut short left there (default: a temporary folder)")
    args = parser.parse_args(argv)
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"no GPU: {absent}; nothing measured", file=sys.stderr)
        return 2
    runs, confine, settings = (2 if args.quick else args.runs), not args.no_sandbox, VerdictSettings()
    began = time.monotonic()
    with work_folder(args.work) as root:
        made, state, steps = root / "made", root / "state.json", root / "steps.jsonl"
        code = code_digest()
        if state.exists():
            prepared = json.loads(state.read_text())
            refused = _not_gone_on_from(prepared, code, runs, this_gpu())
            if refused:
                print(f"{root} {refused}: remove it to start afresh", file=sys.stderr)
                return 1
            print(f"going on from {root}", file=sys.stderr)
        else:
            shutil.rmtree(made, ignore_errors=True)  # what a run cut before its state was written left
            steps.unlink(missing_ok=True)
            made.mkdir()
            try:
                prepared = prepare(made, made / "store", confine, settings)
            except KeyboardInterrupt:
                print("interrupted before the guard runs began: nothing measured", file=sys.stderr)
                return 1
            if isinstance(prepared, str):
                print(prepared, file=sys.stderr)
                return 1
            prepared |= {"code": code, "runs": runs}
            write_bytes_atomic(state, json.dumps(prepared).encode())
        names, store = prepared["names"], made / "store"
        results = measured_steps(steps, names)
        document = {"gpu": prepared["gpu"], "runs": runs, "calibration": prepared["calibration"], "complete": False,
                    "scenarios": {label: summary_of(done) for label, done in results.items() if done}}
        document["complete"] = guard_rounds(names, runs, lambda name: step(store, name, confine, settings),
                                            document["scenarios"], lambda: _save(args.out, document, began),
                                            results, lambda label, result: _append(steps, label, result))
    _save(args.out, document, began)
    print_summary(document)
    return 0 if document["complete"] else 1


def code_digest() -> str:
    """The code a guard step's numbers depend on: the referee's modules, the guard's, this bench and the two tasks."""
    files = [*(ROOT / "guard").glob("*.py"), Path(__file__).resolve(),
             *(f for task in ("matmul_f32", "softmax_f32") for f in (CASES / task).iterdir() if f.is_file())]
    return digest(referee_source() | {path.relative_to(ROOT).as_posix(): sha256_file(path) for path in files})


def this_gpu() -> str | None:
    """This host's GPU model, as NVML names it (None without NVML)."""
    return Nvml().board().name


def _not_gone_on_from(prepared: dict, code: str, runs: int, gpu: str | None) -> str | None:
    if prepared.get("code") != code:
        return "holds the runs of other code (the referee's, the guard's, this bench's or the tasks')"
    if prepared.get("runs") != runs:
        return f"was begun for {prepared.get('runs')} runs, not {runs}"
    if None not in (gpu, prepared.get("gpu")) and prepared["gpu"] != gpu:  # another model's ratios and slowdown
        return f"was begun on a {prepared.get('gpu')}, not this {gpu}"
    return None


@contextmanager
def work_folder(kept: Path | None) -> Iterator[Path]:
    if kept is None:
        with tempfile.TemporaryDirectory(prefix="guard-gpu-") as folder:
            yield Path(folder)
    else:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept


def prepare(root: Path, store: Path, confine: bool, settings: VerdictSettings) -> dict | str:
    """A fresh key, both approvals, the 3% slower copy and the wrong one: the scenarios' approval names, the
    calibration and the GPU; or what failed."""
    private, public, _ = generate(root / "keys")
    keys_dir(store).mkdir(parents=True)
    shutil.copy(public, keys_dir(store))
    failed = approve_both(root, store, private, confine)
    if failed:
        return failed
    slower, calibration = slower_copy(store, private, "matmul-tiled", confine, settings)
    loaded = load_approval(store, "matmul-tiled")
    variants.copy_with(store, loaded, "matmul-tiled-wrong", variants.one_wrong_element(
        loaded.source("kernel.cu"), load_task(loaded.path("task"))), private, "one wrong element")
    names = {"unchanged matmul-tiled": "matmul-tiled", "unchanged softmax": "softmax", "3% slower": slower,
             "one wrong element": "matmul-tiled-wrong"}
    return {"names": names, "calibration": calibration, "gpu": loaded.approval.fingerprint.gpu}


def measured_steps(steps: Path, names: dict[str, str]) -> dict[str, list[StepResult]]:
    """The guard steps a run cut short recorded in `steps` (one JSON line each), per scenario. A last line cut in
    its writing (a kill) is dropped from the file, its step measured again."""
    results: dict[str, list[StepResult]] = {label: [] for label in names}
    if not steps.exists():
        return results
    kept = []
    for line in steps.read_text().splitlines(keepends=True):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break
        results[entry["label"]].append(StepResult.model_validate(entry["result"]))
        kept.append(line if line.endswith("\n") else line + "\n")
    write_bytes_atomic(steps, "".join(kept).encode())
    return results


def _append(steps: Path, label: str, result: StepResult) -> None:
    with steps.open("a") as out:
        out.write(json.dumps({"label": label, "result": result.model_dump(mode="json")}) + "\n")


def approve_both(root: Path, store: Path, key: Path, confine: bool) -> str | None:
    """The two played runs approved into `store`; what failed, or None."""
    for name, task_name, baseline, attempt in (("matmul-tiled", "matmul_f32", "reference.cu", "initial.cu"),
                                               ("softmax", "softmax_f32", "reference.cu", "initial.cu")):
        run = played_run(root, task_name, baseline, attempt, confine)
        code = guard_cli(["approve", str(run), "--store", str(store), "--name", name, "--key", str(key),
                          "--repeats", "2"] + ([] if confine else ["--no-sandbox"]))
        if code != 0:
            return f"the approval of {name} failed (exit {code})"
    return None


def guard_rounds(names: dict[str, str], runs: int, guard: Callable[[str], StepResult], scenarios: dict,
                 save: Callable[[], None], results: dict[str, list[StepResult]] | None = None,
                 record: Callable[[str, StepResult], None] | None = None) -> bool:
    """`runs` rounds of one guard step per scenario (label: approval name), each step's summary put in `scenarios`
    and saved at once, and the step itself handed to `record`; True when all ran. `results`: the steps an earlier
    run measured, gone on from (its last round completed first). An interrupt (a slot's end) ends it early,
    keeping what was measured, and every round is whole but the last, so that a run cut short leaves every
    scenario alike."""
    results = {label: list((results or {}).get(label, [])) for label in names}
    try:
        for run_index in range(runs):
            due = [label for label in names if len(results[label]) <= run_index]
            if not due:
                continue
            print(f"guard run {run_index + 1} of {runs}", file=sys.stderr, flush=True)
            for label in due:
                results[label].append(guard(names[label]))
                if record is not None:
                    record(label, results[label][-1])
                scenarios[label] = summary_of(results[label])
                save()
    except KeyboardInterrupt:
        print("interrupted: the runs measured so far are kept", file=sys.stderr)
        return False
    return True


def _save(out: Path, document: dict, began: float) -> None:
    document["seconds"] = round(time.monotonic() - began, 1)
    out.write_text(json.dumps(document, indent=2))


def print_summary(document: dict) -> None:
    done = "" if document["complete"] else ", cut short"
    boards = sorted({board for shown in document["scenarios"].values() for board in shown.get("boards", {})})
    print(f"guard on {document['gpu']} ({len(boards)} board{'s' if len(boards) != 1 else ''}: {', '.join(boards)}), "
          f"{document['runs']} runs each planned{done} ({document['seconds']} s):")
    for label, shown in document["scenarios"].items():
        cost = shown["cost_ratio_after_first"]
        print(f"  {label}: {shown['runs']} runs; exit {shown['exit_status']}; verdicts {shown['verdicts']}; rounds "
              f"{min(shown['rounds'])}-{max(shown['rounds'])}"
              + (f"; step / timing median {cost['median']:.2f}, max {cost['max']:.2f}" if cost else "")
              + "".join(f"; the {label}'s shape taken past in {n} case-round(s)"
                        for label, n in shown.get("shape_waived", {}).items()))


if __name__ == "__main__":
    sys.exit(main())
