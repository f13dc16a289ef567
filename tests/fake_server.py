"""A real MCP server over stdio with the fake executor: `python tests/fake_server.py FOLDER`.

It opens its run as `kernel-referee serve` does (server/serve.py `serve_run`): FOLDER holding a run
(lock.json) is resumed, as `serve --run FOLDER`; otherwise FOLDER is the results folder of
`serve --task cases/matmul_f32 --results FOLDER` (the newest unfinished run there is resumed, unless
another process holds it; the first run is FOLDER/run-001). Its exit status is serve's. Used to kill
a server mid-attempt, and to run two servers at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.app import build_server  # noqa: E402
from server.run import RunSettings  # noqa: E402
from server.serve import serve_run  # noqa: E402
from tests.fake_executor import FakeExecutor  # noqa: E402

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"


def main(folder: Path) -> int:
    resume = (folder / "lock.json").exists()
    return serve_run(folder, RunSettings(), None if resume else MATMUL, folder if resume else None, False,
                     lambda task, timing: FakeExecutor(task), lambda run: build_server(run).run("stdio"))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
