"""The node's side of a service run on a Ray cluster (`kernel-referee service --ray`): one actor per run, placed by
Ray where a GPU (or the resource standing in for one) is free, holding the run's real executor.

The actor gets the task's files as bytes (the nodes need not share a file system) and loads the task from its own
copy. Ray's GPU count is a reservation, not isolation: the actor takes the node's own host-wide serving claim on the
GPU Ray gave it (harness/gpu_lease.py), and the executor takes that GPU's timing lease around every timing as it
does on a single host, so a referee process outside Ray never times beside it. `start()`'s facts carry the node's
name, address and GPU, recorded with the run's environment.

The claim, not Ray's count, decides the GPU. Ray numbers a node's GPUs as free or reserved, not by what runs on
them: after the service restarts, a resumed run's actor is placed on the node its run began on (service/ray_executor.py)
but may be handed another of its GPU ids, while the run may resume only on the GPU it began on (server/lifecycle.py).
So an actor given a recorded GPU uses that GPU when its serving claim is free, whatever id Ray handed it, and
reports it held by another process otherwise (its run then waits); a new run's actor uses the GPU Ray handed it when
that one's claim is free, else the first free one of the node (a resumed run may be on Ray's GPU, counted by Ray
under another id). The node has as many actors as Ray's GPUs, so each finds one free. The workers see only their
GPU (CUDA_VISIBLE_DEVICES set to its UUID, sandbox/environment.py), so the actor may drive any GPU of its node: it
lists them all (harness/gpus.py `host_gpus`), not the one Ray's variable leaves it.

Ray is imported inside the functions that run in the actor (the optional extra kernel-referee[fleet]).
"""

from __future__ import annotations

import json
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
                 node_gpus: Callable[[], list[GpuInfo]], what: str, recorded_gpu: str | None = None):
        self._scratch = tempfile.TemporaryDirectory(prefix="kernel-referee-service-")
        self.refused: str | None = None  # why the recorded GPU cannot be had; the actor then holds nothing
        self.executor = None
        try:
            self.gpu, self.claim = take_gpu(node_gpus(), _ray_gpu_ids(), what, recorded_gpu)
        except GpuNotFree as exc:
            self.gpu, self.claim, self.refused = None, None, str(exc)
            return
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
        facts = {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(),
                 "hostname": socket.gethostname(), "pid": os.getpid(), "ray_gpu_ids": _ray_gpu_ids(),
                 "gpu_uuid": self.gpu.uuid if self.gpu else None,
                 "gpu_index": self.gpu.index if self.gpu else None,
                 "serving_claim": None if self.gpu is None else "held" if self.claim is not None else "shared"}
        return {**facts, "refused": self.refused} if self.refused else facts

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
            if self.executor is not None:
                self.executor.close()
        finally:
            self._let_go()

    def _let_go(self) -> None:
        if self.claim is not None:
            self.claim.release()
        self._scratch.cleanup()


class GpuNotFree(Exception):
    """The GPU a resumed run began on is not to be had on its node now: another process holds its claim, or the
    node lists it no more."""


def take_gpu(gpus: list[GpuInfo], ray_ids: list[str], what: str,
             recorded: str | None = None) -> tuple[GpuInfo | None, ServingClaim | None]:
    """(the node's GPU this actor runs on, its serving claim where this process holds it). `recorded`: the UUID of
    the GPU a resumed run began on, used whatever Ray handed the actor, where its claim is free (GpuNotFree
    otherwise). Else the GPU Ray handed the actor (by index or UUID) where its claim is free, then the first of the
    node's GPUs that no serving run claims; where every one is claimed, Ray's (or the first) is shared, as a run
    placed there by hand shares it. None: the node lists no GPU (or not Ray's), the executor runs on CUDA's 0."""
    if recorded is not None:
        return _recorded(gpus, recorded, what)
    given = [g for g in gpus if ray_ids and (str(g.index) == ray_ids[0] or g.uuid.lower() == ray_ids[0].lower())]
    if ray_ids and not given:
        return None, None
    for gpu in given + sorted((g for g in gpus if g not in given), key=lambda g: g.index):
        claim = ServingClaim(gpu.uuid, what)
        if claim.try_take():
            return gpu, claim
    return (given or sorted(gpus, key=lambda g: g.index) or [None])[0], None


def _recorded(gpus: list[GpuInfo], uuid: str, what: str) -> tuple[GpuInfo, ServingClaim]:
    gpu = next((g for g in gpus if g.uuid.lower() == uuid.lower()), None)
    if gpu is None:
        raise GpuNotFree(f"the node lists no GPU {uuid} any more (it lists {', '.join(g.uuid for g in gpus) or 'none'})")
    claim = ServingClaim(gpu.uuid, what)
    if not claim.try_take():
        raise GpuNotFree(f"GPU {gpu.index} ({gpu.uuid}) of the node, where the run began, is held by another "
                         f"process{_holder(claim)}; the run waits until it is free")
    return gpu, claim


def _holder(claim: ServingClaim) -> str:
    """Who holds the claim, as its file says (pid and what), for the message that names it."""
    try:
        held = json.loads(claim.path.read_text())
        return f" (pid {held['pid']}: {held['what']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _ray_gpu_ids() -> list[str]:
    import ray  # the optional extra kernel-referee[fleet]: this runs in a Ray actor

    return [str(i) for i in ray.get_gpu_ids()]
