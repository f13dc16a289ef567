"""The service's runs in motion: the queue (a run waits until one of the host's GPUs has no serving claim, so N GPUs
serve N runs), each run's live side opened lazily, and the states a run goes through, written by one scheduler.

Nothing of a run's budget is kept here: a run that comes back after the service was killed is resumed from its run
folder (server/lifecycle.py `resume_run`), which settles an attempt left open as `serve` does."""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from harness.gpu_lease import ServingClaim
from harness.placement import GpuInfo
from harness.task import load_task
from server.report_files import end_report_whole, write_end_report
from server.run import RunSettings
from service import live as lives
from service.auth import RunTokenVerifier, TokenStore
from service.limits import limit_refusal
from service.live import LiveRun, MakeExecutor
from service.pending_reports import PendingReports, finish_pending
from service.records import Role, RunRecord, RunState, now_iso
from service.registry import Registry
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
# How often a running run that waits for the GPU it began on (held by another process) is tried again: each try
# places an actor on its node, so not at every step.
WAITING_RETRY_S = 10.0
CLOSE_WAIT_S = 60.0  # how long a stop waits for a run being let go or admitted to get there


class LimitReached(Exception):
    """A team's limit (queued runs, attempts a day) refuses a new run; nothing was made."""


class GpusBusy(Exception):
    """Every GPU of the service is held (a run serving on it, another review action): a review action that needs
    one is refused at once rather than queued or measured beside a run's timing."""


@dataclass(frozen=True)
class QueuePlace:
    position: int          # 1 = next to get a GPU; 0 = not queued
    length: int
    expected_wait_s: float


class Service:
    def __init__(self, settings: ServiceSettings, make_executor: MakeExecutor, gpus: list[GpuInfo],
                 env: Mapping[str, str] = os.environ, slots_now: Callable[[], list[GpuInfo]] | None = None):
        self.settings = settings
        self.make_executor = make_executor
        # No GPU named by NVML: one slot, CUDA's device 0, as `serve` does on a one-GPU host.
        self.slots: dict[str, GpuInfo | None] = {g.uuid: g for g in gpus} or {"gpu-default": None}
        # A cluster's GPUs as they are now (service/ray_executor.py RayFleet.slots), counted again every
        # settings.slots_refresh_s; None: the host's GPUs, counted once.
        self.slots_now = slots_now
        self._slots_read_at = time.monotonic()
        self.registry = Registry(settings.root)
        self.tokens = TokenStore(settings.root, env)
        self.verifier = RunTokenVerifier(self.tokens, settings.mcp_url)
        self.live: dict[str, LiveRun] = {}
        self.claims: dict[str, ServingClaim] = {}   # run id -> its GPU's serving claim
        self._opening: dict[str, anyio.Lock] = {}
        self._retry_at: dict[str, float] = {}  # run id -> when a waiting run is tried again (time.monotonic)
        self._admitting: set[str] = set()  # runs whose admission goes on in a task of its own
        self._settling: set[str] = set()  # runs let go in a task of their own (executor closed, report written)
        self.reports = PendingReports()  # runs over whose report could not be written yet
        self.closing = False
        self.task_group: TaskGroup | None = None
        self._settle_interrupted()

    def _settle_interrupted(self) -> None:
        """What a kill -9 leaves between a submission's steps, settled before anything is served: its intake folder
        and a run folder without its state file (swept), and a run registered but never queued: failed with the
        cause, since no agent ever saw its token (queued it would hold a GPU for good); it counts against no limit."""
        shutil.rmtree(self.settings.intake_dir, ignore_errors=True)
        for folder in self.registry.unregistered_folders():
            log.warning("removing %s: a run folder whose registration a stop cut short", folder)
            shutil.rmtree(folder, ignore_errors=True)
        for record in self.registry.in_state(RunState.CREATED):
            log.warning("run %s failed: the service stopped before it was queued", record.id)
            self.registry.update(record.id, state=RunState.FAILED, finished_at=now_iso(), error=(
                "the service stopped between registering this run and queueing it, before its agent token was "
                "shown: nothing was spent; submit the task again"))

    # -- runs made and queued ------------------------------------------------------------------------------------

    def create_run(self, task_dir: Path, team: str, max_attempts: int | None = None, note: str = "",
                   queue: bool = True, limited: bool = True) -> tuple[RunRecord, str]:
        """A new run of the task in `task_dir` for `team`, queued unless `queue` is False (intake queues it after its
        checks); its agent token, shown this once. `limited`: the team's limits apply (not to the admin's own runs).
        Raises LimitReached, or the task's load error."""
        budget = max_attempts or self.settings.default_max_attempts
        task = load_task(task_dir)
        if limited:
            self.check_limits(team, budget)
        record = self.registry.create(task_dir, team, task.name, budget, note)
        token = self.tokens.issue(Role.AGENT, team, record.id)
        if queue:
            record = self.registry.enqueue(record.id)
        return record, token

    def check_limits(self, team: str, budget: int) -> None:
        """LimitReached where a new run of `budget` attempts for `team` would pass one of its limits."""
        refusal = limit_refusal(self.registry.all(), self.settings.limits, team, budget)
        if refusal:
            raise LimitReached(refusal)

    def place(self, run_id: str) -> QueuePlace:
        queue = [r.id for r in self.registry.queued()]
        if run_id not in queue:
            return QueuePlace(0, len(queue), 0.0)
        position = queue.index(run_id) + 1
        return QueuePlace(position, len(queue), math.ceil(position / max(len(self.slots), 1)) * self._run_length_s())

    def _run_length_s(self) -> float:
        """How long a run holds its GPU: the median of finished runs', else the assumed length."""
        spans = [(datetime.fromisoformat(r.finished_at) - datetime.fromisoformat(r.started_at)).total_seconds()
                 for r in self.registry.in_state(RunState.FINISHED) if r.started_at and r.finished_at]
        return statistics.median(spans) if spans else self.settings.expected_run_s

    def run_settings(self, record: RunRecord) -> RunSettings:
        return RunSettings(max_attempts=record.max_attempts)

    # -- the live side -------------------------------------------------------------------------------------------

    async def live_run(self, run_id: str) -> LiveRun:
        """The run's live side, opened on first use: resumed from its run folder where one was made, else begun
        and queued; its MCP app's lifespan started in the service's task group."""
        lock = self._opening.setdefault(run_id, anyio.Lock())
        async with lock:
            if run_id in self.live:
                return self.live[run_id]
            record = self.registry.get(run_id)
            run_dir = self.registry.run_dir(run_id)
            if run_dir is not None:
                gpu = self.slots.get(record.gpu_uuid or "")
                run = await anyio.to_thread.run_sync(lives.reopen, run_dir, gpu, self.make_executor,
                                                     self.registry.compiles_journal(run_id))
            else:
                def where() -> tuple[int, int, float]:
                    place = self.place(run_id)
                    return place.position, place.length, place.expected_wait_s
                run = await anyio.to_thread.run_sync(
                    lives.open_queued, self.registry.task_dir(run_id), self.registry.results_dir(run_id),
                    self.run_settings(record), self.make_executor, where, self.registry.compiles_journal(run_id))
            live = LiveRun(run, lives.mcp_app(run, run_id, self.settings, self.verifier))
            live.admitted = run_dir is not None
            await self.task_group.start(lives.serve_lifespan, live)
            self.live[run_id] = live
            return live

    async def close(self) -> None:
        """The scheduler starts nothing more; what it began (a run let go, a report) ends first, then every run."""
        self.closing = True
        with anyio.move_on_after(CLOSE_WAIT_S):
            while self._settling or self._admitting:
                await anyio.sleep(0.05)
        for live in self.live.values():
            live.stop.set()
        for run_id, live in list(self.live.items()):
            await anyio.to_thread.run_sync(_close_run, live)
        for claim in self.claims.values():
            claim.release()

    # -- the scheduler -------------------------------------------------------------------------------------------

    async def schedule_forever(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # noqa: BLE001 - one bad step must not stop the queue; the next step tries again
                log.exception("the service's scheduler step failed")
            await anyio.sleep(self.settings.scheduler_period_s)

    async def step(self) -> None:
        """Running runs taken back after a restart, finished ones let go, then queued runs admitted in order while
        a GPU is free. Each admission goes on in a task of its own (`_admit_behind`), so one that takes long (a
        resumed run's workers starting, on a cluster its actor waiting for a placement) holds up no other run."""
        if self.closing:
            return
        self._refresh_slots()
        for record in self.registry.in_state(RunState.RUNNING):
            live = self.live.get(record.id)
            if self.reports.pending(record):
                self._report_behind(record)
            elif live is None or not live.admitted:
                self._admit_behind(record)
            else:
                self._settle_behind(record, live)
        for record in self.registry.queued():
            gpu_uuid = self._free_slot(record.id)
            if gpu_uuid is None:
                break
            record = self.registry.update(record.id, state=RunState.RUNNING, gpu_uuid=gpu_uuid, started_at=now_iso())
            self._admit_behind(record)

    def _refresh_slots(self) -> None:
        """A cluster's GPUs counted again, and as many slots kept: slots added where it offers more, free slots
        dropped where it offers fewer (those it no longer names first); a slot a run or a review action holds stays
        until it is let go, so a run there ends as its executor does."""
        if self.slots_now is None or time.monotonic() < self._slots_read_at + self.settings.slots_refresh_s:
            return
        self._slots_read_at = time.monotonic()
        try:
            now = {g.uuid: g for g in self.slots_now()}
        except Exception as exc:  # noqa: BLE001 - no GPU in the cluster (NoClusterGpu), or it cannot be asked now
            log.warning("the cluster's GPUs could not be counted: %s", exc)
            now = {}
        held = {claim.gpu for claim in self.claims.values()}
        before = len(self.slots)
        for uuid in sorted((u for u in self.slots if u not in held), key=lambda u: u in now):
            if len(self.slots) <= len(now):
                break
            del self.slots[uuid]
        for uuid, gpu in now.items():
            if len(self.slots) >= len(now):
                break
            self.slots.setdefault(uuid, gpu)
        if len(self.slots) != before:
            log.info("the cluster offers %d GPUs now: the service has %d slots", len(now), len(self.slots))

    def _admit_behind(self, record: RunRecord) -> None:
        """`_admit(record)` in the service's task group, unless the run's admission is under way already. A running
        run taken back after a restart claims its own GPU here, before the step admits any queued run."""
        if record.id in self._admitting:
            return
        if record.id not in self.claims:  # a running run taken back after a restart: its own GPU again
            claim = ServingClaim(record.gpu_uuid or "gpu-default", f"service {record.id}")
            if not claim.try_take():
                return  # another process serves on it now; tried again at the next step
            self.claims[record.id] = claim
        self._admitting.add(record.id)

        async def admit() -> None:
            try:
                await self._admit(record)
            except Exception:  # noqa: BLE001 - as a failed step: logged, and the next step tries again
                log.exception("admitting run %s failed", record.id)
            finally:
                self._admitting.discard(record.id)

        self.task_group.start_soon(admit, name=f"admit {record.id}")

    # -- review actions on a GPU -----------------------------------------------------------------------------------

    @contextmanager
    def review_gpu(self, run_id: str, what: str) -> Iterator[GpuInfo | None]:
        """A free GPU for a review action on run `run_id` (its replay, an approval's rounds), taken as a queued run
        takes one: that GPU's serving claim, held for the block and let go after it, also when the block fails, so
        the scheduler admits no run onto it meanwhile and no run's timing shares it. Yields the GPU the action's
        executor is placed on (None: the one slot of a host NVML names no GPU of, CUDA's device 0). GpusBusy where
        every GPU is held, or another review action of this run holds one: nothing was spent. Taken and let go from
        the event loop's thread, as the scheduler takes and lets go its runs' claims."""
        key = f"review {run_id}"
        if key in self.claims:
            raise GpusBusy(f"another review action of run {run_id} holds a GPU now: {what} was not started, "
                           "nothing was spent; ask again once it has ended")
        uuid = self._free_slot(key)
        if uuid is None:
            raise GpusBusy(f"every GPU of the service is serving a run or another review action ({len(self.slots)} "
                           f"in all): {what} was not started, nothing was spent; ask again once a run has finished")
        try:
            yield self.slots[uuid]
        finally:
            self._release(key)

    def _free_slot(self, run_id: str) -> str | None:
        held = {claim.gpu for claim in self.claims.values()}
        for uuid in self.slots:
            if uuid in held:
                continue
            claim = ServingClaim(uuid, f"service {run_id}")
            if claim.try_take():
                self.claims[run_id] = claim
                return uuid
        return None

    async def _admit(self, record: RunRecord) -> None:
        if time.monotonic() < self._retry_at.get(record.id, 0.0):
            return
        try:
            live = await self.live_run(record.id)
        except (lives.RunGpuBusy, lives.RunNodeGone) as exc:
            self._not_resumed(record, exc)
            return
        if record.waiting is not None:
            self.registry.update(record.id, waiting=None)
            log.info("run %s resumed on the GPU it began on", record.id)
        if not live.admitted:
            gpu = self.slots.get(record.gpu_uuid or "")
            await anyio.to_thread.run_sync(lives.admit, live.run, self.registry.results_dir(record.id), gpu,
                                           self.make_executor)
            live.admitted = True

    def _not_resumed(self, record: RunRecord, exc: Exception) -> None:
        """A running run that cannot resume where it began: failed with the cause where its node is gone, else
        waiting, the reason on its record (GET /api/runs/ID) and in the log once, tried again later."""
        if isinstance(exc, lives.RunNodeGone):
            log.warning("run %s failed: %s", record.id, exc)
            self.registry.update(record.id, state=RunState.FAILED, error=str(exc), finished_at=now_iso())
            self._release(record.id)
            return
        self._retry_at[record.id] = time.monotonic() + WAITING_RETRY_S
        if record.waiting != str(exc):
            log.warning("run %s waits: %s", record.id, exc)
            self.registry.update(record.id, waiting=str(exc))

    def _settle_behind(self, record: RunRecord, live: LiveRun) -> None:
        """`_settle` in the service's task group for a run that is over, unless it is under way already: a report
        to render or a call still ending holds up no other run's admission or end."""
        update = _settled_state(live)
        if update is None or record.id in self._settling:
            return
        self._settling.add(record.id)

        async def settle() -> None:
            try:
                await self._settle(record, live, update)
            except Exception:  # noqa: BLE001 - as a failed step: logged, and the next step tries again
                log.exception("letting run %s go failed", record.id)
            finally:
                self._settling.discard(record.id)

        self.task_group.start_soon(settle, name=f"settle {record.id}")

    async def _settle(self, record: RunRecord, live: LiveRun, update: dict) -> None:
        """A run that is over (`_settled_state`) lets its GPU go: its executor's workers are closed first (no idle
        context of a finished run beside the next run's timings), its report written, then its claim let go. Its
        MCP endpoint stays open for what reads the run."""
        try:
            await anyio.to_thread.run_sync(live.run.executor.close)
        except Exception:  # noqa: BLE001 - the run ends all the same; its workers end with the service at worst
            log.exception("closing the executor of run %s failed", record.id)
        if update["state"] is RunState.FINISHED:  # shown finished with its report written and signed, not before
            if not await anyio.to_thread.run_sync(end_report_whole, live.run):
                self._release(record.id)  # writing a report needs no GPU
                self.registry.note(record.id, report_pending_since=now_iso(), waiting=self.reports.failed(record.id))
                return
        self.registry.update(record.id, finished_at=now_iso(), **update)
        self._release(record.id)

    def _report_behind(self, record: RunRecord) -> None:
        """A run whose report is pending, tried again when due in a task of its own, with no GPU."""
        if record.id in self._settling or not self.reports.due(record.id):
            return
        self._settling.add(record.id)
        run = live.run if (live := self.live.get(record.id)) else None

        async def write() -> None:
            try:
                await anyio.to_thread.run_sync(finish_pending, self.registry, self.reports, record.id, run)
            except Exception:  # noqa: BLE001 - as a failed try: logged, and tried again when due
                log.exception("the report of run %s failed: %s", record.id, self.reports.failed(record.id))
            finally:
                self._settling.discard(record.id)

        self.task_group.start_soon(write, name=f"report {record.id}")

    def _release(self, run_id: str) -> None:
        claim = self.claims.pop(run_id, None)
        if claim is not None:
            claim.release()


def _settled_state(live: LiveRun) -> dict | None:
    """The registry's update for a run that is over: its preparation failed, its budget is spent (or its agent
    finished it), or its executor was lost; None while it goes on."""
    preparation = live.run.preparation
    if preparation is not None and preparation.failed:
        return {"state": RunState.FAILED, "error": preparation.error}
    if (preparation is None or preparation.ready) and live.run.finished:
        return {"state": RunState.FINISHED}
    if getattr(live.run.executor, "lost", None):  # its Ray actor gone with its node (service/ray_executor.py)
        return {"state": RunState.FAILED, "error": live.run.executor.lost}
    return None


def _close_run(live: LiveRun) -> None:
    """At the service's stop: the workers closed (a call in flight ends), a report still due written, then the run
    closed while no call or report holds it, so its folder is let go whole."""
    live.run.executor.close()
    write_end_report(live.run)
    with live.run.exclusive():
        live.run.close()
