"""The node's side of a service run on a Ray cluster (`kernel-referee service --ray`): one actor per run, placed by
Ray where a GPU (or the resource standing in for one) is free, holding the run's real executor.

The actor gets the task's files as bytes (the nodes need not share a file system) and loads the task from its own
copy. Ray's GPU count is a reservation, not isolation: the actor takes the node's own host-wide serving claim on the
GPU Ray gave it (harness/gpu_lease.py), and the executor takes that GPU's timing lease around every timing as it
does on a single host, so a referee process outside Ray never times beside it. `start()`'s facts carry the node's
name, address and GPU, recorded with the run's environment.

Ray is imported inside the functions that run in the actor (the optional extra kernel-referee[fleet]).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.call_limits import CallLimits
from harness.gpu_lease import ServingClaim
from harness.placement import GpuInfo
from harness.settings import TimingSettings
from harness.task import load_task
from harness.task_model import Task
from sandbox.deadline import Deadline
from server.executor import ExecutorError

if TYPE_CHECKING:
    from service.live import MakeExecutor

# The Executor protocol's calls the service side forwards as they are (server/executor.py); within, abort and the
# lease's resume have their own methods.
FORWARDED = frozenset({"compile", "expected", "preload", "expected_trees", "lock_trees", "judging_note", "prepare",
                       "check", "time", "time_vendor", "profile", "fresh_worker"})


def task_files(task: Task) -> dict[str, bytes]:
    """Every file of the task's folder, by path relative to it: what the node loads the task from."""
    root = task.root
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _task_from(files: dict[str, bytes], folder: Path, sent: Task) -> Task:
    for relative, data in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    task = load_task(folder)
    if task.model_copy(update={"root": sent.root}) != sent:
        raise ExecutorError(f"the task loaded on the node is not the run's task {sent.name!r}")
    return task


class NodeExecutor:
    """The run's executor inside its Ray actor (threaded: an abort reaches a call in flight)."""

    def __init__(self, files: dict[str, bytes], sent: Task, timing: TimingSettings, make: MakeExecutor,
                 node_gpus: Callable[[], list[GpuInfo]], what: str):
        self._scratch = tempfile.TemporaryDirectory(prefix="kernel-referee-service-")
        self.gpu, self.claim = take_gpu(node_gpus(), _ray_gpu_ids(), what)
        try:
            task = _task_from(files, Path(self._scratch.name) / "task", sent)
            self.executor = make(task, timing, self.gpu)
        except BaseException:
            self._let_go()
            raise
        self._within = None

    def node(self) -> dict:
        """Where the run's GPU work executes: the Ray node, this process, the GPU and whether its claim is held."""
        import ray  # the optional extra kernel-referee[fleet]: this runs in a Ray actor

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid(), "ray_gpu_ids": _ray_gpu_ids(),
                "gpu_uuid": self.gpu.uuid if self.gpu else None,
                "serving_claim": None if self.gpu is None else "held" if self.claim is not None else "shared"}

    def start(self) -> dict:
        return {**self.executor.start(), "ray_node": self.node()}

    def call(self, name: str, *args):
        if name not in FORWARDED:
            raise ValueError(f"{name!r} is not a call the service forwards to a run's executor")
        return getattr(self.executor, name)(*args)

    def enter_within(self, seconds: float | None, remaining_s: float | None, launch_s: dict, baseline_ms: dict):
        """The call's limits, its deadline made again on this node's clock from what is left of it."""
        deadline = Deadline(remaining_s)
        deadline.seconds = seconds  # the call's whole length, for the messages that name it
        self._within = self.executor.within(CallLimits(deadline, launch_s, baseline_ms))
        self._within.__enter__()

    def exit_within(self) -> None:
        within, self._within = self._within, None
        if within is not None:
            within.__exit__(None, None, None)

    def abort(self) -> None:
        self.executor.abort()

    def resume_lease(self) -> None:
        lease = getattr(self.executor, "gpu_lease", None)
        if lease is not None:
            lease.resume()

    def close(self) -> None:
        try:
            self.executor.close()
        finally:
            self._let_go()

    def _let_go(self) -> None:
        if self.claim is not None:
            self.claim.release()
        self._scratch.cleanup()


def take_gpu(gpus: list[GpuInfo], ray_ids: list[str], what: str) -> tuple[GpuInfo | None, ServingClaim | None]:
    """(the node's GPU this actor runs on, its serving claim where this process holds it). The GPU Ray gave the
    actor, by index or UUID; where Ray names none (a custom resource stands in for GPUs), the first of the node's
    GPUs that no serving run claims. A GPU another process claims is shared, as a run placed there by hand shares
    it; None: the node lists no GPU, the executor runs on the one CUDA numbers 0."""
    if ray_ids:
        given = [g for g in gpus if str(g.index) == ray_ids[0] or g.uuid.lower() == ray_ids[0].lower()]
        if not given:
            return None, None
        claim = ServingClaim(given[0].uuid, what)
        return given[0], claim if claim.try_take() else None
    for gpu in sorted(gpus, key=lambda g: g.index):
        claim = ServingClaim(gpu.uuid, what)
        if claim.try_take():
            return gpu, claim
    return (min(gpus, key=lambda g: g.index), None) if gpus else (None, None)


def _ray_gpu_ids() -> list[str]:
    import ray  # the optional extra kernel-referee[fleet]: this runs in a Ray actor

    return [str(i) for i in ray.get_gpu_ids()]
