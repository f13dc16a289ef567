"""A real MCP server over stdio with the fake executor: `python tests/fake_server.py FOLDER`.

FOLDER holding a run (lock.json): resume it. Otherwise start a new run of cases/matmul_f32 with
FOLDER as its results folder (the run is FOLDER/run-001). Used to kill a server mid-attempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.task import load_task  # noqa: E402
from server.app import build_server  # noqa: E402
from server.lifecycle import new_run, resume_run  # noqa: E402
from server.run import RunSettings  # noqa: E402
from tests.fake_executor import FakeExecutor  # noqa: E402

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"


def main(folder: Path) -> None:
    executor = FakeExecutor(load_task(MATMUL))
    if (folder / "lock.json").exists():
        run = resume_run(folder, executor)
    else:
        run = new_run(MATMUL, folder, RunSettings(), executor)
    try:
        build_server(run).run("stdio")
    finally:
        run.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
