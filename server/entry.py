"""The `kernel-referee` script's entry point: the command line's modules (numpy, cuda-python, mcp) take a
moment to import, and Ctrl-C in that moment ends the command with one line, like Ctrl-C anywhere else."""

from __future__ import annotations

import sys

from server.cli_args import EXIT_INTERRUPTED


def main() -> int:
    try:
        from server.cli import main as command_line  # here, where Ctrl-C during the import is caught
    except KeyboardInterrupt:
        print("kernel-referee: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return command_line()
