"""A real MCP server with the fake executor: `python tests/fake_server.py FOLDER [PORT]`.

FOLDER holding a run (lock.json): resume it. Otherwise start a new run of cases/matmul_f32 with
FOLDER as its results folder (the run is FOLDER/run-001). Over stdio, or with PORT over streamable
HTTP on 127.0.0.1:PORT with the bearer token in $KERNEL_REFEREE_TOKEN. Used to kill a server
mid-attempt, and to leave one mid-attempt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.task import load_task  # noqa: E402
from server import transport  # noqa: E402
from server.app import build_server  # noqa: E402
from server.lifecycle import new_run, resume_run  # noqa: E402
from server.run import RunSettings  # noqa: E402
from tests.fake_executor import FakeExecutor  # noqa: E402

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"


def main(folder: Path, port: int | None = None) -> None:
    executor = FakeExecutor(load_task(MATMUL))
    if (folder / "lock.json").exists():
        run = resume_run(folder, executor)
    else:
        run = new_run(MATMUL, folder, RunSettings(), executor)
    try:
        if port is None:
            transport.run(build_server(run), "stdio")
        else:
            token = os.environ[transport.TOKEN_ENV]
            transport.run(build_server(run, **transport.http_auth(token, "127.0.0.1", port)), "http", port=port,
                          token=token)
    finally:
        run.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
