"""Starting, feeding, killing and restarting GPU worker processes.

The parent owns every deadline: a job that outlives its deadline gets the worker's whole process
group killed, and the next job starts a fresh worker. A worker that reported a sticky CUDA error
exits by itself and is replaced the same way; one that reported a launch past its limit (too slow)
is killed at once, its kernel still running. A job sent within a tool call's deadline
(sandbox/deadline.py) never waits past it: not to start the worker, not for the answer, not to
reap a worker that faulted.

Workers are confined by default (sandbox/confine.py: Landlock, a new network namespace, rlimits),
each to its own scratch folder; `confine=False` is the explicit opt-out, which the caller records.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from sandbox import wire
from sandbox.confine import Confinement
from sandbox.grants import gpu_worker_confinement
from sandbox.deadline import Deadline
from sandbox.environment import worker_environment
from sandbox.answers import Status

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 90.0
REAP_S = 10.0  # how long a killed worker (or one that exits after a fault) is waited for
# Each direction's shared memory region (sparse: only what a message touches is memory).
REGION_BYTES = 1 << 30


class WorkerError(RuntimeError):
    """The worker process failed for reasons that are not the candidate's (start-up, crash, protocol)."""


class WorkerCrashed(WorkerError):
    """The worker died while holding a job."""


class JobTimeout(Exception):
    """The job outlived its deadline (or the worker could not start before the call's); the worker was killed."""


class Worker:
    """One GPU worker process, started lazily and replaced after a fault, a crash or a timeout."""

    def __init__(self, name: str, *, command: Sequence[str], device: int = 0,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, confine: bool = True,
                 confinement: Callable[[Path], Confinement] = gpu_worker_confinement, gpu_uuid: str | None = None):
        self.name = name
        self.gpu_uuid = gpu_uuid  # the one GPU the worker sees (as its device 0); None: CUDA's own numbering
        self.command = tuple(command)
        self.confine = confine
        self.confinement = confinement  # the spec for its scratch folder
        self.device = device
        self.startup_timeout_s = startup_timeout_s
        self.starts = 0
        self.hello: dict | None = None
        self._process: subprocess.Popen | None = None
        self._jobs = None
        self._reader: wire.DeadlineReader | None = None
        self._scratch: Path | None = None
        self._stderr = None
        self._regions: tuple[wire.Region, wire.Region] | None = None  # (jobs, answers), once the worker maps them
        self._shared = False
        self.in_flight = False  # a job sent and not yet answered
        # Keys ("NAME:SHA256") of the input buffers the worker said it keeps for the next jobs.
        self.resident_inputs: frozenset[str] = frozenset()

    # -- life cycle -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, within: Deadline | None = None) -> dict:
        """Start the process and wait for its 'ready' message (device facts), never past `within`."""
        within = within or Deadline.never()
        timeout_s = within.cap(self.startup_timeout_s)
        self.stop()
        self.resident_inputs = frozenset()
        self._scratch = Path(tempfile.mkdtemp(prefix=f"kernel-referee-{self.name}-"))
        confine_args = self._confine_args()
        jobs_read, jobs_write = os.pipe()
        answers_read, answers_write = os.pipe()
        regions = (wire.Region.create(f"{self.name}-jobs", REGION_BYTES),
                   wire.Region.create(f"{self.name}-answers", REGION_BYTES))
        self._stderr = open(self._scratch / "stderr.log", "w+b")
        try:
            self._process = subprocess.Popen(
                [*self.command, str(jobs_read), str(answers_write), str(self.device), *confine_args,
                 f"--shm={regions[0].fd},{regions[1].fd},{REGION_BYTES}"],
                pass_fds=(jobs_read, answers_write, regions[0].fd, regions[1].fd),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self._stderr, cwd=self._scratch, env=worker_environment(self._scratch, self.gpu_uuid),
                start_new_session=True)  # its own process group: a kill takes every child with it
        except BaseException:
            for region in regions:
                region.close()
            raise
        finally:
            os.close(jobs_read)
            os.close(answers_write)
        self._regions = regions
        self.starts += 1
        self._jobs = os.fdopen(jobs_write, "wb")
        self._reader = wire.DeadlineReader(answers_read)
        self._answers_fd = answers_read
        try:
            hello, _ = self._receive(time.monotonic() + timeout_s, 1 << 20, within.cap(REAP_S))
        except JobTimeout:
            if timeout_s < self.startup_timeout_s:
                raise JobTimeout(f"{self.name} worker did not start before the call's deadline") from None
            raise WorkerError(f"{self.name} worker did not start within {self.startup_timeout_s:.0f} s") from None
        if hello.get("status") != Status.READY:
            self.stop()
            raise WorkerError(f"{self.name} worker could not start: {hello.get('error')}: {hello.get('detail')}")
        self._check_confined(hello)
        self.hello = hello
        self._shared = hello.get("shared_regions") is True  # a worker that did not map the regions gets every blob by pipe
        log.info("%s worker %d ready on %s (%s)", self.name, self._process.pid, hello["device"]["name"],
                 "confined" if hello.get("confined") else "not confined")
        return hello

    def _confine_args(self) -> list[str]:
        """The worker applies the spec itself, first thing: a preexec_fn would run in a forked copy
        of this (threaded) server, where little is safe to do."""
        if not self.confine:
            return []
        return ["--confine=" + self.confinement(self._scratch).to_json()]

    def _check_confined(self, hello: dict) -> None:
        """A worker asked to confine itself that says it did not is not used."""
        if self.confine and hello.get("confined") is not True:
            self.stop()
            raise WorkerError(f"{self.name} worker was asked to confine itself but reports "
                              f"confined={hello.get('confined')!r}")
        for note in hello.get("confinement_notes", []):
            log.warning("%s worker: %s", self.name, note)

    def ensure_started(self, within: Deadline | None = None) -> dict:
        if not self.alive:
            self.start(within)
        return self.hello

    def interrupt(self) -> None:
        """SIGKILL the process group from another thread; the thread waiting on the job sees it die."""
        process = self._process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill(self, wait_s: float = REAP_S) -> None:
        """SIGKILL the worker's whole process group (it may be stuck in a kernel); wait at most `wait_s` for it."""
        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(wait_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive:
            try:
                wire.send(self._jobs, {"op": "exit"})
                self._process.wait(timeout=grace_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _reap(self, wait_s: float = REAP_S) -> None:
        if self._process is not None:
            try:
                self._process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:  # the Popen object reaps it later, when it goes
                log.warning("%s worker %d did not die within %.1f s of SIGKILL", self.name, self._process.pid, wait_s)
        for closer in (self._jobs, self._reader, self._stderr):
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
        if self._reader is not None:
            try:
                os.close(self._answers_fd)
            except OSError:
                pass
        self._jobs = self._reader = self._stderr = None
        for region in self._regions or ():
            region.close()
        self._regions, self._shared = None, False
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._process = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- jobs -------------------------------------------------------------------------------
    def call(self, header: dict, blobs: list, deadline_s: float, max_answer_bytes: int,
             within: Deadline | None = None) -> tuple[dict, list[bytes]]:
        """Send one job and wait for its answer, at most `deadline_s` seconds after sending, and never past
        `within` (the tool call's deadline: starting the worker and reaping it count too)."""
        within = within or Deadline.never()
        self.ensure_started(within)
        self.in_flight = True
        try:
            try:
                wire.send(self._jobs, header, blobs, self._regions[0] if self._shared else None)
            except (BrokenPipeError, OSError) as exc:
                detail = self._death_note()
                self.kill()
                raise WorkerCrashed(f"{self.name} worker died before taking the job ({exc}); {detail}") from None
            answer, answer_blobs = self._receive(time.monotonic() + within.cap(deadline_s), max_answer_bytes,
                                                 within.cap(REAP_S))
        finally:
            self.in_flight = False
        if answer.get("status") == Status.FAULT:
            self._reap_after_fault(within.cap(REAP_S))
        elif answer.get("status") == Status.TOO_SLOW:
            self.kill(within.cap(REAP_S))  # its kernel still runs: the process must go for the GPU to be free
        return answer, answer_blobs

    def _receive(self, deadline: float, max_bytes: int, reap_s: float = REAP_S) -> tuple[dict, list[bytes]]:
        try:
            return self._reader.receive(deadline, max_bytes, self._regions[1] if self._shared else None)
        except wire.WireTimeout:
            self.kill(reap_s)
            raise JobTimeout(f"{self.name} worker killed at its deadline") from None
        except wire.PeerClosed:
            detail = self._death_note()
            self.kill()
            raise WorkerCrashed(f"{self.name} worker died: {detail}") from None
        except wire.WireError as exc:
            self.kill()
            raise WorkerError(f"{self.name} worker sent a malformed answer: {exc}") from None

    def _reap_after_fault(self, wait_s: float = REAP_S) -> None:
        """The worker exits by itself after a sticky error; wait briefly, then make sure."""
        try:
            self._process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill(wait_s)

    def _death_note(self) -> str:
        code = self._process.poll() if self._process else None
        if code is None:
            try:
                code = self._process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"{how}; stderr: {self.stderr_tail() or '(empty)'}"

    def stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode(errors="replace").strip()
        except OSError:
            return ""


class WorkerPool:
    """The reference kernel and the candidates never share a worker (nor a CUDA context).

    `command`: the worker program, started with the pipes' descriptors and the device appended. With
    `gpu_uuid`, both workers see that GPU only (CUDA_VISIBLE_DEVICES), as their device 0."""

    def __init__(self, command: Sequence[str], device: int = 0, confine: bool = True, gpu_uuid: str | None = None):
        self.confine = confine
        self.gpu_uuid = gpu_uuid
        self.reference = Worker("reference", command=command, device=device, confine=confine, gpu_uuid=gpu_uuid)
        self.candidate = Worker("candidate", command=command, device=device, confine=confine, gpu_uuid=gpu_uuid)

    def close(self) -> None:
        self.reference.stop()
        self.candidate.stop()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
