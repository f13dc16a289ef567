"""The `kernel-referee` command line: parses arguments and calls one function per command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from harness.device import gpu_absent_reason
from harness.worker_side.compile_policy import CompileRefused
from harness.settings import TimingSettings
from harness.task_model import LaunchError, LaunchSpec, TaskError
from harness.task import load_task
from harness.launch_checks import check_candidate_launch
from harness.placement import parse_choice
from server.check import run_check, targets_for
from server.cost import CostInputs, cost_sheet, model_cost_recorded, render, run_hours
from server.demo import run_demo
from server.replay import replay
from server.folder_lock import EXIT_HELD, FolderHeld
from server.report_files import write_report_held
from server.run import RunSettings
from server.serve import serve, verify
from server.transport import loopback_refusal
from server.task_commands import lint, lint_first, new_task
from server.settings import RefereeSettings, sandbox_refusal
from server.verify import verify_run
from server.keys import SigningKeyError
from server.cli_args import (ATTEMPT_NUMBER, ATTEMPTS, ITERATIONS, PORT, PROBES, REPEATS, WARMUPS, Parser,
                             UsageError, amount)
from server.cli_errors import failed, one_line

NO_SANDBOX_HELP = ("run compile and GPU workers without Landlock, network namespace and rlimits "
                   "(recorded in lock.json; needed where the kernel lacks Landlock)")


COST_OPTIONS = ("engineer-hours", "hourly-rate", "model-cost", "gpu-hour-cost", "invocations-per-month",
                "ms-saved-end-to-end")


GPU_HELP = "the GPU to use: an index or a UUID, as nvidia-smi -L prints them (default: one no run serves on)"


# The commands server/entry.py hands to the rooms above this one, named in --help so that a person finds them.
OTHER_COMMANDS = {"approve": "make a signed approval of a run's best (the regression guard, docs/guard.md)",
                  "keygen": "make an approver's key pair", "guard": "replay a store's approvals on this GPU",
                  "service": "the audit service: many runs, queued for this host's GPUs (docs/service.md)"}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kernel-referee", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="more commands, each with its own --help:\n" + "\n".join(
                        f"  {name:<20}{text}" for name, text in OTHER_COMMANDS.items()))
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="run the full check and timing protocol on a task's kernels")
    check.add_argument("task", type=Path, help="task folder (holding task.toml)")
    check.add_argument("--kernel", type=Path, help="a .cu file to check instead of the reference and the baseline")
    check.add_argument("--launch", help='launch geometry as JSON, e.g. {"grid": ["ceil_div(n,32)", "m"], '
                                        '"block": [32], "shared_bytes": 0}; default: the task\'s')
    check.add_argument("--warmups", type=WARMUPS, default=TimingSettings().warmups)
    check.add_argument("--iterations", type=ITERATIONS, default=TimingSettings().iterations)
    check.add_argument("--no-cold-l2", action="store_true", help="time with a warm L2 (default: flushed)")
    check.add_argument("--json", type=Path, help="also write the full results as JSON here")
    check.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP)
    check.add_argument("--gpu", metavar="N|UUID", help=GPU_HELP)

    _serve_parser(commands)
    _task_parsers(commands)

    demo = commands.add_parser("demo", help="a scripted agent plays a whole run of matmul_f32 against the real "
                               "server over stdio and prints a table (without a GPU: compiles its kernels)")
    demo.add_argument("--results", type=Path, default=RefereeSettings().results, help="where the run goes (default ./results)")
    demo.add_argument("--task", type=Path, help="a task folder whose kernel has matmul_f32's signature, e.g. one "
                      "with other shapes (default: cases/matmul_f32)")
    demo.add_argument("--warmups", type=WARMUPS, default=TimingSettings().warmups, help="passed to serve")
    demo.add_argument("--iterations", type=ITERATIONS, default=TimingSettings().iterations, help="passed to serve")
    demo.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP)
    demo.add_argument("--profile", action="store_true", help="serve with --profile and show one profile_kernel call")

    verify = commands.add_parser("verify", help="check a run folder's signed log, its files and its end (exit 0: "
                                 "ok; 1: failed; 5: unsigned, made before signing)")
    verify.add_argument("run", type=Path)
    verify.add_argument("--public-key", metavar="FINGERPRINT", help="the fingerprint `serve` and `finish` printed: "
                        "refuse a log signed by any other key")

    replay = commands.add_parser("replay", help="re-run a run's best on this GPU (its cases, the holdout, fresh "
                                 "values, timing beside the baseline) and say GO or NO-GO")
    replay.add_argument("run", type=Path)
    replay.add_argument("--repeats", type=REPEATS, default=3, help="interleaved timings beside the baseline (default 3)")
    replay.add_argument("--attempt", type=ATTEMPT_NUMBER, help="replay this attempt instead of the best (e.g. one that was "
                                                   "disqualified); writes replay-attempt-NNN.json")
    replay.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP)
    replay.add_argument("--gpu", metavar="N|UUID", help=GPU_HELP + "; default: the run's own GPU where it is here")

    cost = commands.add_parser("cost", help="the cost sheet of a run: pilot cost, monthly saving, payback")
    cost.add_argument("run", type=Path)
    for name in COST_OPTIONS:  # --model-cost defaults to the usage.cost_usd the run's attempts recorded
        cost.add_argument(f"--{name}", type=amount, required=name != "model-cost",
                          help="default: the sum of usage.cost_usd in history.json" if name == "model-cost" else None)

    report = commands.add_parser("report", help="write report.html, heatmap.png and heatmap.svg in a run folder")
    report.add_argument("run", type=Path)
    for name in COST_OPTIONS:
        report.add_argument(f"--{name}", type=amount, help="cost sheet input (give all six for the full sheet)")
    return parser



def _serve_parser(commands) -> None:
    serve = commands.add_parser("serve", help="start (or resume) a run and serve it to an agent over MCP")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", type=Path, help="task folder: start a new run")
    source.add_argument("--run", type=Path, help="run folder: resume it (budget and history continue)")
    serve.add_argument("--results", type=Path, default=RefereeSettings().results, help="where new runs go (default ./results)")
    serve.add_argument("--new-run", action="store_true",
                       help="start a new run even if an unfinished run of this task exists (by default it is resumed)")
    serve.add_argument("--max-attempts", type=ATTEMPTS, default=RunSettings().max_attempts, metavar="N",
                       help="attempts in the run's budget")
    serve.add_argument("--max-iterations", dest="max_attempts", type=ATTEMPTS, default=argparse.SUPPRESS, metavar="N",
                       help="the same as --max-attempts (the seed tool's name for it)")
    serve.add_argument("--probes-per-window", type=PROBES, default=RunSettings().probes_per_window,
                       help="probes allowed between two attempts")
    serve.add_argument("--warmups", type=WARMUPS, default=TimingSettings().warmups)
    serve.add_argument("--iterations", type=ITERATIONS, default=TimingSettings().iterations)
    serve.add_argument("--transport", choices=["stdio", "http"], default=RefereeSettings().transport)
    serve.add_argument("--host", default=RefereeSettings().host, help="HTTP only; loopback by default")
    serve.add_argument("--port", type=PORT, default=RefereeSettings().port, help="HTTP only")
    serve.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP)
    serve.add_argument("--profile", action="store_true",
                       help="let the agent profile candidates with Nsight Compute (profile_kernel); off by default")
    serve.add_argument("--use-nsight", dest="profile", action="store_true", default=argparse.SUPPRESS,
                       help="the same as --profile (the seed tool's name for it)")
    serve.add_argument("--key-dir", type=lambda text: Path(text).resolve(), metavar="DIR",
                       help="keep the run's private signing key in DIR (mode 700, readable only by this user), not in "
                       "the run folder: an agent with a shell as another user cannot sign a rewritten log")
    serve.add_argument("--keep-expected", action="store_true",
                       help="write every case's expected outputs into the run folder, even those of cases judged on "
                       "the device (kept there as sha256-trees by default)")
    serve.add_argument("--gpu", metavar="N|UUID", help="the GPU to serve on: an index or a UUID as nvidia-smi -L prints "
                       "them (default: one no other run serves on; a resumed run goes back on its own)")

def _task_parsers(commands) -> None:
    new = commands.add_parser("new-task", help="make a task folder from a signature, the reference and initial "
                              "kernels and a cases file (docs/task-format.md), then lint it")
    new.add_argument("folder", type=Path, help="the task folder to make (new, or empty)")
    new.add_argument("--description", required=True, help="what the kernel computes, for people and agents")
    new.add_argument("--signature", required=True, help='extern "C" __global__ void NAME(TYPE a, ...)')
    new.add_argument("--reference", type=Path, required=True, help="the trusted kernel (copied as reference.cu)")
    new.add_argument("--initial-kernel", type=Path, required=True, help="the baseline (copied as initial.cu)")
    new.add_argument("--input-cases", type=Path, required=True, help="the cases file (JSON)")
    new.add_argument("--oracle", type=Path, help="an independent float64 oracle (copied as oracle.py)")
    new.add_argument("--name", help="the task's name (default: the folder's)")
    lint = commands.add_parser("lint", help="refuse a degenerate task (outputs a kernel computing nothing passes, "
                               "a tolerance TF32 passes, cases that do not fit); CPU only")
    lint.add_argument("task", type=Path, help="task folder (holding task.toml)")


def _launch(text: str | None) -> LaunchSpec | None:
    if text is None:
        return None
    try:
        return LaunchSpec.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise UsageError(f"--launch is not JSON: {exc}") from None
    except ValidationError as exc:
        raise UsageError(f"--launch is not a valid launch geometry: {one_line(exc)}") from None


def settings_of(args: argparse.Namespace) -> RefereeSettings:
    """The one settings object of a command: its options over RefereeSettings' defaults. The
    argparse namespace stops here."""
    given = vars(args)
    timing = TimingSettings(**{key: given[key] for key in ("warmups", "iterations") if given.get(key) is not None},
                            cold_l2=not given.get("no_cold_l2", False))
    run = RunSettings(timing=timing, profile=bool(given.get("profile")), keep_expected=bool(given.get("keep_expected")),
                      **{key: given[key] for key in ("max_attempts", "probes_per_window", "key_dir")
                         if given.get(key) is not None})
    return RefereeSettings(run=run, confine=not given.get("no_sandbox", False),
                           **{key: given[key] for key in ("transport", "host", "port", "results")
                              if given.get(key) is not None})


def _check(args, settings: RefereeSettings) -> int:
    if args.launch is not None and args.kernel is None:
        raise UsageError("--launch needs --kernel: the task's own reference and baseline use the task's launches")
    launch = _launch(args.launch)
    task = load_task(args.task)
    if launch is not None:  # resolved on every case here, so a bad geometry is refused on a machine without a GPU
        try:
            check_candidate_launch(launch, list(task.cases))
        except LaunchError as err:
            raise UsageError(f"--launch {err}") from None
    lint_first(task, settings.run.timing, sys.stdout)
    targets = targets_for(task, args.kernel, launch)
    refusal = sandbox_refusal(settings.confine)
    if refusal:
        print(f"kernel-referee: {refusal}", file=sys.stderr)
        return 2
    if args.gpu is not None:
        parse_choice(args.gpu)  # a malformed --gpu is refused before anything runs
    return run_check(task, targets, settings.run.timing, sys.stdout, args.json, confine=settings.confine, gpu=args.gpu)


def _run_folder(path: Path) -> Path:
    """A folder that holds a run (run.json, lock.json or events.jsonl), or the usage error naming what it is."""
    if not path.exists():
        raise UsageError(f"{path}: no such run folder")
    if not path.is_dir():
        raise UsageError(f"{path}: not a folder (a run folder holds run.json, lock.json, events.jsonl...)")
    if not any((path / name).exists() for name in ("run.json", "lock.json", "events.jsonl")):
        raise UsageError(f"{path}: not a run folder (no run.json, lock.json or events.jsonl)")
    return path


def _serve(args, settings: RefereeSettings) -> int:
    """Every argument is checked before the GPU is looked for and before anything is made: the run folder, the
    GPU's name, the host, the task and its lint; then serve() takes the port. On a GPU the lint's compiles (a
    compile worker's start and two compiles, about 2 s) are the run's preparation's first step instead, so that
    `initialize` is answered without waiting for them (server/serve.py)."""
    run_dir = _run_folder(args.run) if args.run is not None else None
    if args.gpu is not None:
        parse_choice(args.gpu)
    if settings.transport == "http" and (refusal := loopback_refusal(settings.host)) is not None:
        raise UsageError(refusal)
    if args.task is not None:
        on_gpu = gpu_absent_reason() is None  # the probe serve started first (server/entry.py), answered once
        lint_first(load_task(args.task), settings.run.timing, sys.stderr, "kernel-referee serve: ", compiles=not on_gpu)
    return serve(settings, args.task, run_dir, start_new=args.new_run, gpu=args.gpu)


def _verify(args) -> int:
    return verify(_run_folder(args.run), sys.stdout, args.public_key)


def _cost(args) -> int:
    run_dir = _run_folder(args.run)
    report = verify_run(run_dir)
    if not report.ok:
        raise UsageError(f"refused: {run_dir} does not verify ({report.problems[0] if report.problems else '?'}; "
                         f"`kernel-referee verify {run_dir}` lists every problem), so its hours cannot be trusted")
    model_cost = args.model_cost if args.model_cost is not None else model_cost_recorded(run_dir, sys.stdout)
    inputs = CostInputs(engineer_hours=args.engineer_hours, hourly_rate=args.hourly_rate, model_cost=model_cost,
                        gpu_hour_cost=args.gpu_hour_cost, invocations_per_month=args.invocations_per_month,
                        ms_saved_end_to_end=args.ms_saved_end_to_end)
    wall, busy, kernel_saved = run_hours(run_dir)
    print(render(cost_sheet(inputs, wall, busy, kernel_saved)), file=sys.stdout)  # the report, not MCP
    return 0


def _report(args) -> int:
    given = {name.replace("-", "_"): getattr(args, name.replace("-", "_")) for name in COST_OPTIONS}
    if any(v is not None for v in given.values()) and not all(v is not None for v in given.values()):
        missing = ", ".join(f"--{k.replace('_', '-')}" for k, v in given.items() if v is None)
        print(f"kernel-referee: the cost sheet needs all six cost options; missing {missing}", file=sys.stderr)
        return 2
    inputs = CostInputs(**given) if all(v is not None for v in given.values()) else None
    run_dir = _run_folder(args.run)
    if run_dir.is_dir():  # the report files themselves are written again: the rest must verify
        report = verify_run(run_dir, derived=False)
        if not report.ok:
            raise UsageError(f"refused: {run_dir} does not verify ({report.problems[0] if report.problems else '?'}; "
                             f"`kernel-referee verify {run_dir}` lists every problem), so its report would show "
                             "values nobody can trust")
    try:
        written = write_report_held(run_dir, inputs)
    except FolderHeld as held:
        print(f"kernel-referee: {held}", file=sys.stderr)
        return EXIT_HELD
    except SigningKeyError as exc:
        print(f"kernel-referee: the report was written but derived.json could not be signed: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path, file=sys.stdout)
    return 0


def _dispatch(args, settings: RefereeSettings) -> int:
    if args.command == "check":
        return _check(args, settings)
    if args.command == "serve":
        return _serve(args, settings)
    if args.command == "new-task":
        return new_task(args.folder, description=args.description, signature=args.signature, reference=args.reference,
                        initial=args.initial_kernel, cases_file=args.input_cases, oracle=args.oracle, name=args.name,
                        out=sys.stdout)
    if args.command == "lint":
        return lint(args.task, sys.stdout)
    if args.command == "demo":
        return run_demo(settings, sys.stdout, args.task)
    if args.command == "verify":
        return _verify(args)
    if args.command == "cost":
        return _cost(args)
    if args.command == "replay":
        if args.gpu is not None:
            parse_choice(args.gpu)
        return replay(_run_folder(args.run), sys.stdout, repeats=args.repeats, attempt=args.attempt,
                      confine=settings.confine, sandbox_refusal=lambda: sandbox_refusal(settings.confine), gpu=args.gpu)
    if args.command == "report":
        return _report(args)
    raise UsageError(f"unknown command {args.command!r}")


def main(argv: list[str] | None = None) -> int:
    """Every failure ends here as one line on stderr and its exit code (README, "Exit codes"), never a traceback."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    prog = f"kernel-referee {args.command}"
    try:
        return _dispatch(args, settings_of(args))
    except BaseException as exc:  # noqa: BLE001 - sorted below; SystemExit passes through
        return failed(prog, exc)


if __name__ == "__main__":
    sys.exit(main())
