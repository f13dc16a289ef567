"""A compiled kernel's instruction mix, read in the compile worker while the GPU checks the kernel.

nvdisasm costs about a quarter of a second a CUBIN, nearly all of it its own start, and nothing needs the mix
before the kernel is timed: the arithmetic rule (harness/arithmetic.py) is judged before the kernel's first
timing. So record_attempt compiles without it (harness/compile_service.py `read_mix=False`), starts the checks,
and reads it here on a thread of its own while the GPU checks the kernel and then times its references (the
baseline and the best come first in each round); `result()` joins, in the caller's thread, at the latest just
before the kernel's own first timing (server/attempt.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from harness.results import Reason, ReasonCode
from harness.settings import CompiledKernel
from server.candidates import Candidate

if TYPE_CHECKING:  # the run's and the record's types only: neither is imported here at run time
    from server.records import AttemptRecord
    from server.run import Run


def kernel_ahead(run: Run, candidate: Candidate) -> tuple[CompiledKernel | None, Any, MixReading | None]:
    """As `run.kernel`, for a kernel that is checked before it is timed: where the executor reads instruction mixes
    apart (GpuExecutor.read_mix), a new compile's CompiledKernel comes as soon as NVRTC is done and its mix is read
    in the compile worker meanwhile (the MixReading); its result, the whole compile result, is what the arithmetic
    is judged by, before the kernel is timed. Elsewhere, or for a cache hit, `run.kernel`'s answer and None."""
    read_mix = getattr(run.executor, "read_mix", None)
    if read_mix is None:
        return (*run.kernel(candidate), None)
    compiled = run.executor.compile(candidate.source, candidate.options, read_mix=False)
    if not compiled.ok or compiled.mix is not None:  # failed, or a cache hit: nothing left to read
        run.note_compile(candidate, compiled)
        return run.kernel_of(candidate, compiled), compiled, None
    reading = MixReading(read_mix, compiled, lambda whole: run.note_compile(candidate, whole))  # noted when read
    return CompiledKernel(candidate.id, compiled.cubin, compiled.lowered_name, candidate.launch), compiled, reading


class MixReading:
    """`read(compiled)` on a thread of its own, started now; `result()` waits for it, then calls `done` with the
    whole compile result (its mix read, or failed saying why) in the caller's thread, once."""

    def __init__(self, read: Callable[[Any], Any], compiled: Any, done: Callable[[Any], None]):
        self._read, self._compiled, self._done = read, compiled, done
        self._whole: Any = None
        self._error: BaseException | None = None
        self._joined = False
        self._thread = threading.Thread(target=self._run, name="read-mix", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._whole = self._read(self._compiled)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if not self._joined:
            self._joined = True
            self._done(self._whole)
        return self._whole


def compile_summary(compiled: Any) -> dict:
    """What an attempt records of its compile: the outcome, its log, resources and instruction mix."""
    r = compiled.resources
    return {"ok": compiled.ok, "compile_ms": compiled.compile_ms, "cache_hit": compiled.cache_hit,
            "log": compiled.log, "resources": r.model_dump(mode="json") if r else None,
            "mix": compiled.mix.model_dump(mode="json") if compiled.mix else None}


class NotTimed(Exception):
    """The candidate is refused before its first timing."""

    def __init__(self, reasons: list[Reason]):
        super().__init__(str(reasons))
        self.reasons = reasons


class ArithmeticGate:
    """Where a new compile's instruction mix is still being read (a MixReading), the candidate may not be timed
    before it is judged: the rule and an unreadable CUBIN are judged when the mix is known, at the latest
    just before the candidate's first timing."""

    def __init__(self, run: Run, entry: AttemptRecord, candidate: Candidate, compiled: Any, reading: MixReading | None):
        self.run, self.entry, self.candidate, self.compiled, self.reading = run, entry, candidate, compiled, reading
        self.judged = False

    def settle(self) -> None:
        """Waits for the mix being read, if any, and puts the whole compile result in the entry (the reading notes
        the compile then)."""
        if self.reading is not None:
            self.compiled, self.reading = self.reading.result(), None
            self.entry.compile = compile_summary(self.compiled)

    def refusal(self) -> list[Reason] | None:
        """Why the compiled candidate may not be timed (the arithmetic its task forbids, a CUBIN that could not be
        read); None where it may. Waits for the mix being read."""
        self.settle()
        self.judged = True
        if self.compiled.ok and (refusal := self.run.arithmetic_refusal(self.candidate, self.compiled)) is not None:
            return [refusal]  # compiled, but on units the task forbids: rejected before it is timed
        if not self.compiled.ok:
            return [Reason(code=ReasonCode.COMPILE_ERROR, detail=self.compiled.log)]
        return None

    def before_first(self, label: str) -> None:
        if label == "candidate" and not self.judged and (refused := self.refusal()) is not None:
            raise NotTimed(refused)
