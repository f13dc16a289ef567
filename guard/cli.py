"""The regression guard's commands: `approve`, `keygen` and `guard`, reached through the `kernel-referee`
script (server/entry.py). Each parses, calls one function, and turns a known failure into one line and its
exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from guard import accepted
from guard import run as guard_run
from guard.approve import EXIT_APPROVED, ApproveOptions, approve
from guard.signing import ApprovalKeyError, generate
from guard.store import StoreRefused, check_name
from server.cli_args import ATTEMPT_NUMBER, REPEATS, Parser, UsageError, whole_number
from server.cli_errors import failed

COMMANDS = ("approve", "keygen", "guard")
EXIT_STORE_REFUSED = 2  # a store that does not verify (also the usage code: both mean "fix the input")
KEY_VARIABLE = "KERNEL_REFEREE_APPROVAL_KEY"  # approve's --key when none is given
RATIO_ROUNDS = whole_number(accepted.FEWEST_ROUNDS, 1000)
NO_SANDBOX_HELP = "run compile and GPU workers without Landlock, network namespace and rlimits"


def _name(text: str) -> str:
    try:
        return check_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="kernel-referee", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    add = commands.add_parser("approve", help="make a signed approval in STORE from a finished run's best (or attempt N)")
    add.add_argument("run", type=Path, help="the run folder")
    add.add_argument("--attempt", type=ATTEMPT_NUMBER, help="approve this attempt instead of the run's best")
    add.add_argument("--store", type=Path, required=True, help="the approval store (a folder kept in git)")
    add.add_argument("--name", type=_name, required=True, help="the approval's name in the store")
    add.add_argument("--note", help="why it is approved, kept in the approval")
    add.add_argument("--key", type=Path, help=f"the approver's private key (keygen); default ${KEY_VARIABLE}")
    add.add_argument("--force", action="store_true", help="approve a run whose replay is not GO, or that does not "
                     "verify; recorded in the approval with what it overrode")
    add.add_argument("--repeats", type=REPEATS, default=3, help="the replay's timings, where none is recorded (default 3)")
    add.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP + " (the replay, where one is run)")
    add.add_argument("--gpu", metavar="N|UUID", help="the GPU the replay and the accepted ratio's rounds run on")
    add.add_argument("--ratio-rounds", type=RATIO_ROUNDS, default=accepted.DEFAULT_ROUNDS, metavar="N",
                     help="interleaved rounds of the kernel beside its baseline that measure each case's accepted "
                     f"ratio on this GPU, as the guard measures (default {accepted.DEFAULT_ROUNDS}, at least "
                     f"{accepted.FEWEST_ROUNDS})")
    add.add_argument("--from-run", action="store_true", help="take the accepted ratio from the run's own timing "
                     "instead (no GPU needed; its interval leaves out the shift between jobs); recorded")

    keygen = commands.add_parser("keygen", help="make an approval key pair in DIR: NAME.key (private) and NAME.pub "
                                 "(copy it into STORE/keys/ to trust it)")
    keygen.add_argument("dir", type=Path)
    keygen.add_argument("--name", type=_name, default="approver", help="the files' name (default approver)")

    guard = commands.add_parser("guard", help="replay the store's approved kernels on this GPU: pass, regressed, "
                                "improved, incorrect or inconclusive, per approval and case")
    guard.add_argument("store", type=Path)
    guard.add_argument("--only", nargs="+", type=_name, metavar="NAME", help="guard only these approvals")
    guard.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    guard.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON here")
    guard.add_argument("--html", type=Path, metavar="FILE", help="write an HTML page here")
    guard.add_argument("--accept", action="store_true", help="a passing run on a new environment becomes the "
                       "approval's accepted baseline, signed again")
    guard.add_argument("--key", type=Path, help=f"the key --accept signs with; default ${KEY_VARIABLE}")
    guard.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="fan the approvals out over a Ray "
                       "cluster, one GPU each (kernel-referee[fleet])")
    guard.add_argument("--no-sandbox", action="store_true", help=NO_SANDBOX_HELP)
    guard.add_argument("--gpu", metavar="N|UUID", help="the GPU to guard on")
    return top


def _approve(args) -> int:
    key = args.key or (Path(os.environ[KEY_VARIABLE]) if os.environ.get(KEY_VARIABLE) else None)
    if key is None:
        raise UsageError(f"approve signs with a key: give --key KEY or set ${KEY_VARIABLE} "
                         "(`kernel-referee keygen DIR` makes one)")
    options = ApproveOptions(run=args.run, store=args.store, name=args.name, key=key, attempt=args.attempt,
                             note=args.note, force=args.force, repeats=args.repeats, confine=not args.no_sandbox,
                             gpu=args.gpu, ratio_rounds=args.ratio_rounds, from_run=args.from_run)
    return approve(options, sys.stdout)


def _keygen(args) -> int:
    private, public, key_id = generate(args.dir, args.name)
    print(f"private key: {private} (keep it out of the store)\npublic key:  {public}\nkey id:      {key_id}\n"
          f"trust it: copy {public.name} into STORE/keys/", file=sys.stdout)
    return EXIT_APPROVED


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    prog = f"kernel-referee {args.command}"
    try:
        if args.command == "approve":
            return _approve(args)
        if args.command == "keygen":
            return _keygen(args)
        return guard_run.main(args)
    except StoreRefused as refused:
        print(f"{prog}: the store does not verify:", file=sys.stderr)
        for problem in refused.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_STORE_REFUSED
    except ApprovalKeyError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_STORE_REFUSED
    except BaseException as exc:  # noqa: BLE001 - sorted by the referee's one edge; SystemExit passes through
        return failed(prog, exc)
