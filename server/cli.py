"""The `kernel-referee` command line: parses arguments and calls one function per command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from harness.compile import CompileRefused
from harness.evaluate import Settings
from harness.task import LaunchSpec, TaskError, load_task


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel-referee", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="run the full check and timing protocol on a task's kernels")
    check.add_argument("task", type=Path, help="task folder (holding task.toml)")
    check.add_argument("--kernel", type=Path, help="a .cu file to check instead of the reference and the baseline")
    check.add_argument("--launch", help='launch geometry as JSON, e.g. {"grid": ["ceil_div(n,32)", "m"], '
                                        '"block": [32], "shared_bytes": 0}; default: the task\'s')
    check.add_argument("--warmups", type=int, default=Settings().warmups)
    check.add_argument("--iterations", type=int, default=Settings().iterations)
    check.add_argument("--no-cold-l2", action="store_true", help="time with a warm L2 (default: flushed)")
    check.add_argument("--json", type=Path, help="also write the full results as JSON here")
    return parser


def _launch(text: str | None) -> LaunchSpec | None:
    if text is None:
        return None
    try:
        return LaunchSpec.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise SystemExit(f"kernel-referee: --launch is not a valid launch geometry: {exc}") from None


def _check(args) -> int:
    from server.check import run_check, targets_for

    task = load_task(args.task)
    settings = Settings(warmups=args.warmups, iterations=args.iterations, cold_l2=not args.no_cold_l2)
    targets = targets_for(task, args.kernel, _launch(args.launch))
    return run_check(task, targets, settings, sys.stdout, args.json)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check(args)
    except (TaskError, CompileRefused, OSError) as exc:
        print(f"kernel-referee: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
