"""`kernel-referee service --ray ADDRESS`: each run's GPU work on a Ray cluster's GPU node, the service host needing
no GPU.

`RayFleet` connects to the cluster and counts its GPUs (or the resource standing in for them): the queue's slots
(service/core.py). Its `make_executor` gives each run a `RayExecutor`, the Executor protocol (server/executor.py)
forwarded call by call to a Ray actor of its own (service/ray_node.py `NodeExecutor`), asking for one GPU and placed
by Ray where one is free. The actor is made on the run's first GPU call, so a queued run, or a finished one reopened
to be read, holds none. It is threaded, so `abort()` reaches a call in flight; `within(limits)` is sent as an enter
and an exit. An actor that dies (its node lost, its process killed) is an ExecutorError, as a broken worker is on
one host; the run's later calls are refused with the same error, since its expected outputs and its GPU went with
it. Closing the run closes the executor on the node, then kills the actor.

A run resumed after the service restarted goes back where it began (service/live.py `reopen` hands `began_on` the
`ray_node` facts its lock.json recorded): its actor asks Ray for that node by id (NodeAffinitySchedulingStrategy,
soft=False), and for the GPU of that node it began on, by UUID (service/ray_node.py `take_gpu`: the GPU's serving
claim, not Ray's GPU id, keeps two runs off one GPU). A node no longer in the cluster is RunNodeGone: Ray gives a
node that rejoins a new id, and the run's GPU went with it, so the service fails the run with that cause. A
recorded GPU another process holds is RunGpuBusy: the run waits, tried again later (service/core.py).

Ray is an optional extra (`kernel-referee[fleet]`), imported here only inside functions: the service without
`--ray` runs without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Iterator

from harness.call_limits import CallLimits
from harness.gpus import host_gpus
from harness.placement import GpuInfo
from harness.settings import TimingSettings
from harness.task_model import Task
from server.executor import ExecutorError, GpuExecutor
from service.live import MakeExecutor, RunGpuBusy, RunNodeGone
from service.ray_node import NodeExecutor, task_files

GPU = "GPU"
# Past a call's own deadline, how long the service waits for the node's answer before it counts the node as lost.
ANSWER_GRACE_S = 30.0
PLACEMENT_TIMEOUT_S = 600.0  # how long a run's actor may wait for Ray to find it a GPU


class NoClusterGpu(Exception):
    """The Ray cluster cannot be reached, or has none of the resource a run's actor asks for."""


def node_gpu_executor(task: Task, timing: TimingSettings, gpu: GpuInfo | None, confine: bool = True) -> GpuExecutor:
    """The real executor, made in the run's actor on the GPU the node gave it (a module-level function: Ray sends
    it to the node by name)."""
    return GpuExecutor(task, timing, confine=confine, gpu=gpu, lease_what="service via Ray")


def join_fleet(address: str, make_on_node: MakeExecutor, resource: str = GPU) -> tuple["RayFleet", list[GpuInfo]]:
    """The fleet at `address` and its slots; NoClusterGpu where it cannot be joined or offers no GPU."""
    fleet = RayFleet(make_on_node, resource)
    try:
        fleet.connect(address)
    except ConnectionError as exc:
        raise NoClusterGpu(f"the Ray cluster at {address!r} cannot be joined: {exc}") from None
    return fleet, fleet.slots()


def actor_options(resource: str = GPU) -> dict:
    """What each run's actor asks Ray for: one GPU, or one of a custom resource standing in for GPUs. No CPU is
    reserved: the actor waits on its GPU workers, and a CPU reservation would cap runs per node below its GPUs."""
    asked = {"num_gpus": 1} if resource == GPU else {"resources": {resource: 1}}
    return {"num_cpus": 0, "max_concurrency": 4, **asked}


class RayFleet:
    """The service's side of a Ray cluster: its slots, and each run's executor there."""

    def __init__(self, make_on_node: MakeExecutor, resource: str = GPU,
                 node_gpus: Callable[[], list[GpuInfo]] = host_gpus, placement_timeout_s: float = PLACEMENT_TIMEOUT_S):
        self.make_on_node, self.resource, self.node_gpus = make_on_node, resource, node_gpus
        self.placement_timeout_s = placement_timeout_s
        self.options = actor_options(resource)

    @staticmethod
    def connect(address: str) -> None:
        """Join the cluster at `address` ("auto": the one this host runs, else a local one started here)."""
        try:
            import ray  # the optional extra kernel-referee[fleet]: loaded only when --ray is given
        except ImportError:
            raise NoClusterGpu("--ray needs Ray: pip install 'kernel-referee[fleet]'") from None

        if not ray.is_initialized():
            ray.init(address=None if address == "auto" else address, include_dashboard=False, log_to_driver=False)

    def slots(self) -> list[GpuInfo]:
        """One queue slot per unit of the resource in the cluster now, each named for the service's own claim."""
        import ray  # the optional extra kernel-referee[fleet], connected before this

        count = int(ray.cluster_resources().get(self.resource, 0))
        if count < 1:
            raise NoClusterGpu(f"the Ray cluster has no {self.resource}: no run could be placed there")
        return [GpuInfo(i, f"ray-{self.resource}-{i + 1}") for i in range(count)]

    def make_executor(self, task: Task, timing: TimingSettings, gpu: GpuInfo | None) -> "RayExecutor":
        """A run's executor on the cluster; `gpu` (the service's slot) only counts runs, Ray chooses the GPU."""
        return RayExecutor(self, task, timing)


class RemoteLease:
    """The run's lease as the server's lease code sees it (server/lease_waits.py): `resume` reaches the node, where
    the lease is; its waits are not brought back (the node's own log tells them)."""

    def __init__(self, executor: "RayExecutor"):
        self.executor = executor
        self.waits: list = []
        self.listener = None
        self.what = "service"

    def resume(self) -> None:
        """Called by the gate before each call's work (server/call_gate.py); a lost executor refuses here already."""
        self.executor._on_node("resume_lease", placing=False)

    def abort(self) -> None:
        self.executor.abort()


class RayExecutor:
    """The Executor protocol, each call forwarded to the run's actor on the cluster."""

    def __init__(self, fleet: RayFleet, task: Task, timing: TimingSettings):
        self.fleet, self.task, self.timing = fleet, task, timing
        self.actor = None
        self.facts: dict | None = None
        self.home: dict | None = None  # the `ray_node` facts of where a resumed run began; None: anywhere
        self.lost: str | None = None  # why the actor is gone, once it is
        self._aborts: list = []  # aborts sent and not yet seen done (their ObjectRefs)
        self.gpu_lease = RemoteLease(self)
        self._limits: CallLimits | None = None
        self._placing = threading.Lock()

    # -- the actor -----------------------------------------------------------------------------------------------

    def _placed(self):
        with self._placing:
            if self.lost is not None:
                raise ExecutorError(self.lost)
            if self.actor is None:
                self.actor = self._place()
            return self.actor

    def began_on(self, environment: dict) -> None:
        """The run resumes: its actor goes to the node and GPU its locked environment names (none: anywhere)."""
        self.home = environment.get("ray_node") or None

    def _place(self):
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet

        fleet = self.fleet
        options, recorded_gpu = self._where()
        actor = ray.remote(**options)(NodeExecutor).remote(
            task_files(self.task), self.task, self.timing, fleet.make_on_node, fleet.node_gpus, "service via Ray",
            recorded_gpu)
        try:
            facts = ray.get(actor.node.remote(), timeout=fleet.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise ExecutorError(f"the Ray cluster found no free {fleet.resource} for the run within "
                                f"{fleet.placement_timeout_s:g} s") from None
        except ray.exceptions.RayActorError as exc:
            raise ExecutorError(f"the run's executor could not start on the Ray cluster: {exc}") from None
        if facts.get("refused"):
            ray.kill(actor)
            raise RunGpuBusy(f"{self._home_named()}: {facts['refused']}")
        return actor

    def _where(self) -> tuple[dict, str | None]:
        """(the actor's options, the GPU it must use): a resumed run's pinned to the node it began on."""
        if self.home is None or not self.home.get("node_id"):
            return self.fleet.options, None
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # the same optional extra

        node_id = self.home["node_id"]
        if not any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes()):
            raise RunNodeGone(f"{self._home_named()} is no longer in the Ray cluster: the run's GPU went with it "
                              "(a node that rejoins has a new id), and a run resumes only on the GPU it began on")
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return {**self.fleet.options, "scheduling_strategy": strategy}, self.home.get("gpu_uuid")

    def _home_named(self) -> str:
        home = self.home or {}
        return (f"the node the run began on ({home.get('hostname')}, {home.get('ip')}, Ray node "
                f"{str(home.get('node_id'))[:12]})")

    def _on_node(self, method: str, *args, placing: bool = True) -> Any:
        """`method` of the actor with `args`, its answer or its own exception; a lost actor is an ExecutorError."""
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet

        if not placing and self.actor is None:
            return None
        actor = self._placed()
        self._settle_aborts()
        limits = self._limits
        timeout = None if limits is None or limits.deadline.at is None else (
            limits.deadline.remaining() + ANSWER_GRACE_S)
        try:
            return ray.get(getattr(actor, method).remote(*args), timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None  # the executor's own error (OutOfTime, ExecutorError, ...), as on one host
        except ray.exceptions.RayActorError as exc:
            raise self._lose(f"the run's executor on the Ray cluster was lost ({type(exc).__name__}: {exc}); "
                             "this run's GPU work cannot go on") from None
        except ray.exceptions.GetTimeoutError:
            raise self._lose(f"the run's executor on the Ray cluster gave no answer {ANSWER_GRACE_S:g} s past the "
                             "call's deadline; its node is taken as lost") from None

    def _settle_aborts(self) -> None:
        """Wait for the aborts sent so far to be done on the node: the actor is threaded, so a later call (the
        gate's resume of the lease above all) could otherwise run there before them and be undone by them."""
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet

        pending, self._aborts = self._aborts, []
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=ANSWER_GRACE_S)  # a lost actor is seen by the call

    def _lose(self, why: str) -> ExecutorError:
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet

        self.lost = why
        if self.actor is not None:
            ray.kill(self.actor)
        return ExecutorError(why)

    # -- the Executor protocol -----------------------------------------------------------------------------------

    def start(self) -> dict:
        if self.facts is None:
            self.facts = self._on_node("start")
        return self.facts

    def compile_arch(self) -> str | None:
        """Known once the actor started: the cluster's GPU a queued run will get is not known before, so a queued
        run on Ray compiles nothing ahead (service/live.py `open_queued`)."""
        return (self.facts or {}).get("arch")

    def compile(self, source, options):
        return self._on_node("call", "compile", source, options)

    def expected(self, case, seed):
        return self._on_node("call", "expected", case, seed)

    def preload(self, case, seed, outputs) -> None:
        self._on_node("call", "preload", case, seed, outputs)

    def expected_trees(self, case, seed):
        return self._on_node("call", "expected_trees", case, seed)

    def lock_trees(self, case, seed, trees) -> None:
        self._on_node("call", "lock_trees", case, seed, trees)

    def judging_note(self):
        return self._on_node("call", "judging_note")

    def prepare(self, cases, seeds) -> None:
        self._on_node("call", "prepare", cases, seeds)

    def check(self, kernel, cases, seeds=None, against_oracle=False):
        return self._on_node("call", "check", kernel, cases, seeds, against_oracle)

    def time(self, kernel, cases):
        return self._on_node("call", "time", kernel, cases)

    def time_vendor(self, cases):
        return self._on_node("call", "time_vendor", cases)

    def profile(self, kernel, case, metrics):
        return self._on_node("call", "profile", kernel, case, metrics)

    def fresh_worker(self) -> None:
        self._on_node("call", "fresh_worker", placing=False)

    @contextmanager
    def within(self, limits: CallLimits) -> Iterator[None]:
        deadline = limits.deadline
        self._on_node("enter_within", deadline.seconds, None if deadline.at is None else deadline.remaining(),
                      dict(limits.launch_s), dict(limits.baseline_ms))
        self._limits = limits
        try:
            yield
        finally:
            self._limits = None
            if self.lost is None:
                self._on_node("exit_within")

    def abort(self) -> None:
        """Sent beside the call in flight (the actor is threaded); nothing to abort where no actor was placed."""
        actor = self.actor
        if actor is not None and self.lost is None:
            # Not waited for: the call in flight answers once its job is killed; the next call waits for it.
            self._aborts.append(actor.abort.remote())

    def close(self) -> None:
        import ray  # the optional extra kernel-referee[fleet], connected by RayFleet

        with self._placing:
            actor, self.actor = self.actor, None
            self.lost = self.lost or "the run's executor was closed"
        if actor is None:
            return
        try:
            ray.get(actor.close.remote(), timeout=ANSWER_GRACE_S)  # its workers stopped and its claim let go
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass  # a lost or stuck actor: killed below all the same
        ray.kill(actor)
