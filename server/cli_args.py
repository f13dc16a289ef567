"""What the command line accepts: numbers bounded where they are parsed, errors on one line, exit codes.

A number out of its range is refused by argparse before anything runs, with the usage exit code; the
ranges are the ones a run can hold (attempt files are numbered with three digits).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

# The exit codes every command shares (README, "Exit codes"); a command's own outcomes use 0, 1 and 3 (and
# serve's 4 and 5).
EXIT_USAGE = 2          # bad arguments, or an input that cannot be used (no such folder, not a run folder...)
EXIT_INTERNAL = 70      # an error inside kernel-referee itself (sysexits' EX_SOFTWARE): a bug, named on one line
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it
EXIT_PORT_IN_USE = 5    # serve --transport http: another process listens on the port; nothing was made

MAX_ATTEMPTS = 999      # attempts/NNN.cu


class UsageError(Exception):
    """Arguments that parse but cannot be used together or on this input: exit EXIT_USAGE."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (`kernel-referee check: argument --warmups: ...`); --help has
    the usage."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`, both included."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: from {low} to {high}")
        return value

    return parse


def amount(text: str) -> float:
    """An argparse type: a finite number, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of zero or more")
    return value


WARMUPS = whole_number(0, 10_000)
ITERATIONS = whole_number(1, 10_000)
ATTEMPTS = whole_number(1, MAX_ATTEMPTS)
ATTEMPT_NUMBER = whole_number(0, MAX_ATTEMPTS)
PROBES = whole_number(0, 10_000)
REPEATS = whole_number(1, 100)
PORT = whole_number(1, 65_535)
