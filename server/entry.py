"""The `kernel-referee` script's entry point: the command line's modules (numpy, cuda-python, mcp) take a
moment to import, and Ctrl-C in that moment ends the command with one line, like Ctrl-C anywhere else.

It is the house's door: the regression guard's commands (`approve`, `keygen`, `guard`) belong to guard/,
a room above server/, and are handed to guard/cli.py here; the audit service's (`service`) to service/cli.py, a
room above guard/; every other command to server/cli.py."""

from __future__ import annotations

import sys

from server.cli_args import EXIT_INTERRUPTED

GUARD_COMMANDS = ("approve", "keygen", "guard")  # guard/cli.py COMMANDS
SERVICE_COMMANDS = ("service",)  # service/cli.py COMMANDS
PROBED_COMMANDS = ("serve", "demo")  # each asks for a GPU first thing (harness/device.py start_probe)


def main() -> int:
    try:
        if len(sys.argv) > 1 and sys.argv[1] in PROBED_COMMANDS:
            from harness import device  # light, and first: the GPU probe starts before the heavy imports below
            device.start_probe()  # the GPU probe runs while the command's modules import
        if len(sys.argv) > 1 and sys.argv[1] in SERVICE_COMMANDS:
            from service.cli import main as command_line  # the door: service/ sits above guard/; Ctrl-C here is caught
        elif len(sys.argv) > 1 and sys.argv[1] in GUARD_COMMANDS:
            from guard.cli import main as command_line  # the door: guard/ sits above server/; Ctrl-C here is caught
        else:
            from server.cli import main as command_line  # here, where Ctrl-C during the import is caught
    except KeyboardInterrupt:
        print("kernel-referee: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return command_line()
