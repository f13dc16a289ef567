"""The audit service on a Ray cluster with the fake executor: `python tests/fake_ray_service.py ROOT PORT ADDRESS`.

It serves as `kernel-referee service --root ROOT --port PORT --ray ADDRESS --ray-resource fake_gpu` does
(service/cli.py), each run's executor a FakeExecutor in a Ray actor on the cluster at ADDRESS, the node's GPUs
FAKE_NODE_GPUS fake ones (tests/fake_executor.py `fake_gpus`). The node functions below travel to the actors by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.gpu_lease import LEASE_DIR_ENV  # noqa: E402
from harness.placement import GpuInfo  # noqa: E402
from harness.settings import TimingSettings  # noqa: E402
from harness.task_model import Task  # noqa: E402
from service.cli import serve  # noqa: E402
from service.ray_executor import RayFleet  # noqa: E402
from service.settings import ServiceSettings  # noqa: E402
from tests.fake_executor import FakeExecutor, fake_gpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FAKE_GPU = "fake_gpu"  # the cluster's custom resource standing in for GPUs
FAKE_NODE_GPUS = 4


def on_node(task: Task, timing: TimingSettings, gpu: GpuInfo | None) -> FakeExecutor:
    """The fake executor on the fake GPU the actor claimed, its facts saying which process runs it (not its GPU's
    name: a resumed run's is compared with the one it began with)."""
    return FakeExecutor(task, placed=gpu, environment={"executor_pid": os.getpid()})


def node_gpus() -> list[GpuInfo]:
    return fake_gpus(FAKE_NODE_GPUS)


def fleet() -> RayFleet:
    return RayFleet(on_node, FAKE_GPU, node_gpus)


def runtime_env(node_leases: Path) -> dict:
    """The actors import the project from the checkout, and keep the node's GPU claims in `node_leases`."""
    return {"env_vars": {"PYTHONPATH": str(REPO), LEASE_DIR_ENV: str(node_leases)}}


def main(root: Path, port: int, address: str) -> int:
    import ray  # noqa: PLC0415 - the optional extra kernel-referee[fleet]

    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             runtime_env=runtime_env(root.parent / f"{root.name}-node-leases"))
    ray_fleet = fleet()
    settings = ServiceSettings(root=root, port=port, scheduler_period_s=0.1)
    return serve(settings, ray_fleet.make_executor, ray_fleet.slots(), ray_fleet.slots)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
