"""A new run's preparation (its reference outputs, the baseline's timing, the vendor library's), done in a thread
behind a server that answers at once: an MCP client gives up on a server that has not answered `initialize`
within its own limit (30 s for some), and the preparation takes 30-90 s on a GPU.

While it runs, describe_task says what is being prepared and about how long it has left; a tool that needs it
waits a few seconds for it, with progress, and is otherwise refused with nothing spent (`NotPrepared`). A
preparation that failed refuses every such call with its reason.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import anyio

from harness.task_model import Task
from sandbox.deadline import Deadline
from server import probes
from server.call import Progress
from server.early_compiles import EarlyCompiles
from server.lifecycle import prepare_new_run
from server.models import PreparationStatus, TaskCase, TaskDescription
from server.run import Refusal, Run

log = logging.getLogger(__name__)
# What a preparation is assumed to take before its own progress says better: the reference outputs and the
# baseline's timing of a task such as matmul_f32 on one GPU.
EXPECTED_S = 60.0
# The most a tool call waits for the preparation (counted in its deadline) before it is refused, nothing spent.
WAIT_S = 10.0
_POLL_S = 0.25
# Below this share done, the estimate is the assumed total: an extrapolation from a few percent is noise.
_TRUSTED_FRACTION = 0.05
AsyncProgress = Callable[[float, float, str], object]


class NotPrepared(Refusal):
    """A call made while the run is being prepared, or after its preparation failed: nothing was done or spent."""


class Preparation:
    """One run's preparation: `work(progress)` in a daemon thread (`start`), or in the caller's (`run_here`)."""

    def __init__(self, work: Callable[[Progress], None], expected_s: float = EXPECTED_S, wait_s: float | None = None,
                 say: Callable[[str], None] | None = None):
        self._work = work
        self.expected_s = expected_s
        self.wait_s = WAIT_S if wait_s is None else wait_s
        self._say = say
        self._started = time.monotonic()
        self._ended: float | None = None
        self.step, self.fraction = "starting the GPU workers", 0.0
        self.error: str | None = None
        self._stopping = False  # the server is ending: a failure from then on is the stop's, said by the server
        self._done = threading.Event()
        self.thread: threading.Thread | None = None
        # Compiles answered meanwhile, without the GPU (server/early_compiles.py): a run queued for a GPU whose arch
        # is known has them; None: compile_kernel waits for the preparation as every other tool does.
        self.early: EarlyCompiles | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run_caught, name="run-preparation", daemon=True)
        self.thread.start()

    def run_here(self) -> None:
        """The whole preparation in this thread; its failure is raised."""
        try:
            self._work(self.progress)
        except BaseException as exc:
            self._fail(exc)
            raise
        self._succeed()

    def stopping(self) -> None:
        """The server ends under the preparation (its client left): a failure that follows, such as a worker killed
        by the stop, is recorded but not said as the task's."""
        self._stopping = True

    def _run_caught(self) -> None:
        try:
            self.run_here()
        except BaseException:  # noqa: BLE001 - recorded in self.error; the calls that need the run say it
            log.debug("the preparation failed", exc_info=True)

    def _succeed(self) -> None:
        self._ended, self.fraction, self.step = time.monotonic(), 1.0, "ready"
        self._done.set()

    def _fail(self, exc: BaseException) -> None:
        self._ended = time.monotonic()
        self.error = str(exc).strip() or type(exc).__name__
        if self._say and not self._stopping:
            self._say(f"kernel-referee: the run could not be prepared: {self.error}")
        self._done.set()

    def progress(self, done: float, total: float, message: str) -> None:
        self.fraction = max(self.fraction, min(done / total, 1.0) if total > 0 else 0.0)
        self.step = message
        if self._say:
            self._say(f"  {message}")

    @property
    def ready(self) -> bool:
        return self._done.is_set() and self.error is None

    @property
    def failed(self) -> bool:
        return self._done.is_set() and self.error is not None

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the preparation has ended (ready or failed) within `timeout_s`."""
        return self._done.wait(timeout_s)

    def expected_left_s(self) -> float | None:
        if self._done.is_set():
            return None
        elapsed = time.monotonic() - self._started
        if self.fraction < _TRUSTED_FRACTION:
            return max(1.0, self.expected_s - elapsed)
        return max(1.0, elapsed * (1 - self.fraction) / self.fraction)

    def status(self) -> PreparationStatus:
        end = self._ended if self._ended is not None else time.monotonic()
        state = "failed" if self.failed else "ready" if self.ready else "preparing"
        return PreparationStatus(state=state, step=self.error or self.step, done_fraction=round(self.fraction, 3),
                                 elapsed_s=round(end - self._started, 1), expected_left_s=_rounded(self.expected_left_s()),
                                 error=self.error)

    def refusal(self) -> NotPrepared:
        """Why a call that needs the run cannot be served now."""
        if self.failed:
            return NotPrepared(f"the run could not be prepared: {self.error}. Nothing was spent; the operator must "
                               "fix this and start the server again.")
        return NotPrepared(f"preparing, ready in about {_rounded(self.expected_left_s()):g} s: the run is being "
                           f"prepared ({self.step}). Nothing was spent (no attempt, probe or compile counted); "
                           "call again then. describe_task shows the progress.")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else float(round(seconds))


def prepare_behind(run: Run, results: Path, say: Callable[[str], None] | None = None,
                   on_ready: Callable[[Run], None] | None = None,
                   check_first: Callable[[Task], None] | None = None) -> Preparation:
    """Start preparing a new run (server/lifecycle.py `begin_new_run`'s) in a thread, `check_first` first (it
    raises to refuse the task: the preparation fails with its message); the run is ready, and described, once it
    has moved into place."""
    def work(progress: Progress) -> None:
        prepare_new_run(run, results, progress, check_first)
        with run.exclusive():
            probes.publish(run)
        if on_ready:
            on_ready(run)

    run.preparation = Preparation(work, say=say)
    run.preparation.start()
    return run.preparation


def described(run: Run) -> TaskDescription:
    """describe_task's answer: the run's, with its preparation's state where it has one; while it is prepared,
    what is known before (the task, the budget), no baseline yet."""
    preparation = run.preparation
    if preparation is None:
        return probes.describe(run)
    if preparation.ready:
        return probes.describe(run).model_copy(update={"preparation": preparation.status()})
    task = run.task
    return TaskDescription(
        name=task.name, description=task.description, kernel_name=task.kernel_name, signature=task.signature,
        parameters=[{"name": p.name, "kind": p.kind, "dtype": p.dtype, "shape": list(p.shape), "value": p.value}
                    for p in task.params],
        cases=[TaskCase(name=c.name, role=c.role, dims=c.dims, baseline_median_ms=None) for c in task.visible_cases],
        tolerances={k: v.model_dump() for k, v in task.tolerances.items()},
        launch_default=task.launch.model_dump(mode="json"), device=run.environment, baseline_score_ms=None,
        best_attempt=0, best_score_ms=None, budget=run.budget(), profiling=run.settings.profile,
        preparation=preparation.status())


def early_compiles(run) -> EarlyCompiles | None:
    """The compiles a run not yet prepared answers now, or None (a prepared run, or one that answers none)."""
    preparation = of(run)
    return None if preparation is None else preparation.early


def of(run) -> Preparation | None:
    """The run's preparation while it is not ready, else None (a resumed run, a run made before serving)."""
    preparation = run.preparation
    return None if preparation is None or preparation.ready else preparation


async def until_prepared(run, deadline: Deadline, tell: AsyncProgress | None) -> None:
    """Return once the run is ready; wait for it at most `wait_s` of the call's deadline, telling the client how
    it goes; else raise NotPrepared, nothing spent."""
    preparation = of(run)
    if preparation is None:
        return
    waited = Deadline(deadline.cap(preparation.wait_s))
    told = None
    while not preparation.wait(0):
        if waited.expired:
            raise preparation.refusal()
        if tell is not None and preparation.step != told:
            told = preparation.step
            await tell(preparation.fraction, 1.0, f"waiting for the run's preparation: {told}")
        await anyio.sleep(min(_POLL_S, waited.remaining()))
    if preparation.failed:
        raise preparation.refusal()
