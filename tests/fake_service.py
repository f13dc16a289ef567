"""The audit service with the fake executor: `python tests/fake_service.py ROOT PORT [GPUS]`.

It serves as `kernel-referee service --root ROOT --port PORT` does (service/cli.py `serve`), on GPUS fake GPUs
(default 1; tests/fake_executor.py `fake_gpus`), its admin token in $KERNEL_REFEREE_ADMIN_TOKEN. Used to drive
many runs through their MCP endpoints at once and to kill the service mid-attempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.cli import serve  # noqa: E402
from service.settings import ServiceSettings  # noqa: E402
from tests.fake_executor import FakeExecutor, fake_gpus  # noqa: E402


def main(root: Path, port: int, gpus: int) -> int:
    settings = ServiceSettings(root=root, port=port, scheduler_period_s=0.1)
    return serve(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(gpus))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1))
