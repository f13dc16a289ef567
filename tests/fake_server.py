"""A real MCP server with the fake executor: `python tests/fake_server.py FOLDER [PORT]`.

It opens its run as `kernel-referee serve` does (server/serve.py `serve_run`): FOLDER holding a run
(lock.json) is resumed, as `serve --run FOLDER`; otherwise FOLDER is the results folder of
`serve --task cases/matmul_f32 --results FOLDER` (the newest unfinished run there is resumed, unless
another process holds it; the first run is FOLDER/run-001). Its exit status is serve's. The host has
$FAKE_SERVER_GPUS fake GPUs (default 1; tests/fake_executor.py `fake_gpus`), and $FAKE_SERVER_GPU is `--gpu`;
a new run's preparation takes $FAKE_SERVER_PREPARE_S seconds more (default 0), and a call waits for it
$FAKE_SERVER_PREPARE_WAIT_S seconds (default server/preparation.py WAIT_S) before it is refused. Over stdio, or with PORT over
streamable HTTP on 127.0.0.1:PORT with the bearer token in $KERNEL_REFEREE_TOKEN. Used to kill a
server mid-attempt, to drop its client, and to run two servers at once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server import preparation, transport  # noqa: E402
from server.app import build_server  # noqa: E402
from server.run import RunSettings  # noqa: E402
from server.serve import serve_run  # noqa: E402
from tests.fake_executor import FakeExecutor, fake_gpus  # noqa: E402

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"


def main(folder: Path, port: int | None = None) -> int:
    resume = (folder / "lock.json").exists()
    prepare_s = float(os.environ.get("FAKE_SERVER_PREPARE_S", "0"))
    if "FAKE_SERVER_PREPARE_WAIT_S" in os.environ:  # how long a call waits for the preparation before it is refused
        preparation.WAIT_S = float(os.environ["FAKE_SERVER_PREPARE_WAIT_S"])

    def served(run) -> None:
        if port is None:
            transport.run(build_server(run), "stdio")
        else:
            token = os.environ[transport.TOKEN_ENV]
            transport.run(build_server(run, **transport.http_auth(token, "127.0.0.1", port)), "http", port=port,
                          token=token)

    return serve_run(folder, RunSettings(), None if resume else MATMUL, folder if resume else None, False,
                     lambda task, timing, gpu: FakeExecutor(task, placed=gpu, prepare_s=prepare_s), served,
                     fake_gpus(int(os.environ.get("FAKE_SERVER_GPUS", "1"))), os.environ.get("FAKE_SERVER_GPU"))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None))
