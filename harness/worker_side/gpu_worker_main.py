"""The GPU worker: one process, one CUDA context, jobs read from a dedicated pipe.

Started by sandbox/pool.py as
`python -m harness.worker_side.gpu_worker_main JOBS_FD ANSWERS_FD DEVICE [--confine=JSON] [--shm=JOBS_MEMFD,ANSWERS_MEMFD,BYTES]`:
with --shm, large blobs travel through the two shared regions (sandbox/wire.py), and 'ready' says so.
Its stdout is not the protocol (device printf writes there). It answers every job, and exits after a
sticky CUDA error so the parent starts a clean one.

With --confine (a sandbox.confine.Confinement as JSON) the worker confines itself before anything
else: numpy and the CUDA driver start threads, and Landlock only restricts the thread that applies
it, so gpu_worker.py, which loads them, is imported only afterwards.
"""

from __future__ import annotations

import os
import sys

from sandbox import confine, wire
from sandbox.answers import Status

EXIT_STARTUP = 4


def confine_from_argv(argv: list[str]) -> dict:
    """Apply the --confine=JSON spec if one is given; the facts for the 'ready' message.

    Raises ConfinementError (or ValueError for a malformed spec) when it cannot be applied.
    """
    specs = [a.split("=", 1)[1] for a in argv if a.startswith("--confine=")]
    if not specs:
        return {"confined": False, "confinement_notes": []}
    notes = confine.apply(confine.Confinement.from_json(specs[-1]))
    return {"confined": True, "confinement_notes": notes}


def regions_from_argv(argv: list[str]) -> tuple:
    """The (jobs, answers) shared regions that --shm names, or (None, None)."""
    specs = [a.split("=", 1)[1] for a in argv if a.startswith("--shm=")]
    if not specs:
        return None, None
    jobs_fd, answers_fd, size = (int(x) for x in specs[-1].split(","))
    return wire.Region(jobs_fd, size), wire.Region(answers_fd, size)


def main(argv: list[str]) -> int:
    positional = [a for a in argv[1:] if not a.startswith("--")]
    jobs_fd, answers_fd, ordinal = int(positional[0]), int(positional[1]), int(positional[2])
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(answers_fd, "wb") as answers:
        try:
            confined = confine_from_argv(argv)
        except (confine.ConfinementError, ValueError, TypeError, OSError) as exc:
            wire.send(answers, {"status": Status.STARTUP_ERROR, "error": "ConfinementError",
                                "detail": f"the worker could not be confined: {exc}"})
            return EXIT_STARTUP
        from harness.worker_side import gpu_worker  # loads CUDA and starts threads: only once confined

        return gpu_worker.serve(jobs, answers, ordinal, confined, regions_from_argv(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
