"""Compiling untrusted kernel sources in a separate, confined, killable process with a deadline.

A source can `#include` any file the compiling process can read (its compiler errors then quote the
file back to the agent), and a template-instantiation bomb can keep NVRTC busy for minutes. So the
parent only checks the request (policy, size, includes) and keeps the cache; NVRTC runs in
`harness.worker_side.compile_worker_main`, which confines itself and limits its memory, and which the
parent kills at the deadline. Whatever
happens to the worker, the caller gets a CompileResult (ok=False with a log saying what happened);
only a request refused by policy raises CompileRefused.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from pydantic import ValidationError

from harness.compile_cache import CompileCache
from harness.worker_side.compile_policy import (COMPILE_MEMORY_BYTES, DEFAULT_ARCH, CompileRefused, CompileRequest,
                                                CompileResult, out_of_memory_message, trim_log, unreadable)
from harness.worker_side.nvrtc import check_request
from harness.worker_side.sass_mix import InstructionMix
from sandbox.pool import JobTimeout, Worker, WorkerCrashed, WorkerError
from sandbox.answers import Status
from sandbox.deadline import Deadline

# Well under the MCP client's 60 s per tool call, which also has to cover a worker start.
DEFAULT_DEADLINE_S = 30.0
STARTUP_TIMEOUT_S = 20.0
COMPILE_WORKER_COMMAND = (sys.executable, "-m", "harness.worker_side.compile_worker_main")
MAX_ANSWER_BYTES = 64 << 20
MAX_CUBIN_BYTES = 32 << 20
MAX_FULL_LOG_CHARS = 16 << 20
MAX_WORKER_DETAIL_CHARS = 2000
ELF_MAGIC = b"\x7fELF"
# What NVRTC's back end (NVVM, ptxas) or the C++ runtime writes on stderr before aborting at the memory limit.
_OUT_OF_MEMORY = re.compile(r"out of memory|std::bad_alloc|Memory allocation failure")
_RESULT_FIELDS = frozenset(CompileResult.model_fields) - {"cubin"}


@dataclass(frozen=True)
class _Request(CompileRequest):
    """A checked request and what the parent does with it."""

    @classmethod
    def checked(cls, source: str, kernel_name: str, options: Sequence[str], arch: str) -> "_Request":
        """The same policy checks as harness.worker_side.nvrtc.compile_kernel, made before any process starts."""
        return cls(**vars(check_request(source, kernel_name, options, arch)))

    def job(self) -> dict:
        return {"op": "compile", "source": self.source_bytes.decode(), "kernel_name": self.kernel_name,
                "options": list(self.options), "arch": self.arch,
                "toolchain": self.toolchain}

    def failed(self, message: str, started: float) -> CompileResult:
        """ok=False with `message` as the log, for a compile the worker did not complete."""
        return CompileResult(
            ok=False, kernel_name=self.kernel_name, lowered_name=None, arch=self.target, options=self.options,
            log=trim_log(message), full_log=message, resources=None,
            compile_ms=(time.perf_counter() - started) * 1000.0, cache_hit=False,
            nvrtc_version=self.nvrtc_version, key=self.key)


class _Malformed(Exception):
    """The worker's answer is not one a sound compile worker sends."""


class CompileService:
    """NVRTC behind a confined compile worker, started lazily and replaced after a kill or a crash."""

    def __init__(self, *, confine: bool = True, deadline_s: float = DEFAULT_DEADLINE_S,
                 cache: CompileCache | None = None, startup_timeout_s: float = STARTUP_TIMEOUT_S):
        self.confine = confine
        self.deadline_s = deadline_s
        self.cache = cache if cache is not None else CompileCache()
        # With confine, Worker asks the process to confine itself and refuses one that reports it did not.
        self.worker = Worker("compile", command=COMPILE_WORKER_COMMAND, confine=confine,
                             startup_timeout_s=startup_timeout_s)
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def start(self) -> dict:
        """Start the worker now (it otherwise starts with the first compile); its 'ready' message."""
        with self._lock:
            return self.worker.ensure_started()

    def compile(self, source: str, kernel_name: str, options: Sequence[str] = (),
                arch: str = DEFAULT_ARCH, within: Deadline | None = None, read_mix: bool = True) -> CompileResult:
        """Compile in the worker; CompileRefused for a request refused by policy, else a result. `within`: the
        tool call's deadline, which caps the compile's own (a compile cut short by it is a failed compile).
        `read_mix=False`: a new compile's result comes without its instruction mix, as soon as NVRTC is done, and
        is not cached until `read_mix` has read it (a cache hit has its mix)."""
        request = _Request.checked(source, kernel_name, options, arch)
        # An entry an in-process compile stored (nvrtc.compile_kernel with this cache) has no instruction mix: the
        # worker compiles it again, and its whole result replaces the entry.
        if (hit := self.cache.get(request.key)) is not None and hit.mix is not None:
            return hit.model_copy(update={"cache_hit": True})
        with self._lock:
            result = self._compile_in_worker(request, within or Deadline.never(), read_mix)
        if result.ok and result.mix is not None:
            self.cache.put(result)
        return result

    def read_mix(self, result: CompileResult, within: Deadline | None = None) -> CompileResult:
        """The result of a `read_mix=False` compile with its CUBIN's instruction mix, read in the worker, and then
        cached; a result that has its mix, or failed, is returned as it is. Where the mix cannot be read (the
        disassembler refuses the CUBIN, the worker dies or runs out of time) the compile fails, saying why, as
        it would have in one job."""
        if not result.ok or result.mix is not None:
            return result
        with self._lock:
            mix, why = self._read_in_worker(result.cubin, within or Deadline.never())
        if mix is None:
            log = unreadable(why)
            return result.model_copy(update={"ok": False, "log": trim_log(log), "full_log": log, "cubin": b"",
                                             "resources": None})
        read = result.model_copy(update={"mix": mix})
        self.cache.put(read)
        return read

    def interrupt(self) -> None:
        """Kill a compile in flight (from another thread); its caller gets ok=False."""
        self._interrupted.set()
        self.worker.interrupt()

    def close(self) -> None:
        self.worker.stop()

    def __enter__(self) -> "CompileService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the worker ---------------------------------------------------------------------------
    def _read_in_worker(self, cubin: bytes, within: Deadline) -> tuple[InstructionMix | None, str]:
        """(the mix, "") or (None, why not)."""
        if within.expired:
            return None, _out_of_time_message(within, "the disassembler")
        self._interrupted.clear()
        try:
            answer, blobs = self.worker.call({"op": "read_mix"}, [cubin], within.cap(self.deadline_s),
                                             MAX_ANSWER_BYTES)
        except JobTimeout:
            if within.expired:
                return None, _out_of_time_message(within, "the disassembler")
            return None, f"the disassembler did not finish within {self.deadline_s:g} s (deadline)"
        except WorkerCrashed as exc:
            if self._interrupted.is_set():
                return None, "interrupted: the call was cancelled"
            return None, f"the compiler process died ({_short(exc)})"
        except WorkerError as exc:
            return None, f"the compiler process is not usable ({_short(exc)})"
        try:
            if blobs:
                raise _Malformed(f"{len(blobs)} blobs in the answer to read_mix")
            return _mix_from(answer)
        except _Malformed as exc:
            self.worker.kill()  # it no longer behaves like the worker we started
            return None, f"the compiler process sent a malformed answer ({exc})"

    def _compile_in_worker(self, request: _Request, within: Deadline, read_mix: bool = True) -> CompileResult:
        started = time.perf_counter()
        if within.expired:
            return request.failed(_out_of_time_message(within), started)
        self._interrupted.clear()
        # A worker that died while idle (an operator, the OOM killer) must not fail this compile:
        # one that was already running gets one retry in a fresh process.
        retries = 1 if self.worker.alive else 0
        while True:
            try:
                answer, blobs = self.worker.call({**request.job(), "mix": read_mix}, [], within.cap(self.deadline_s),
                                                 MAX_ANSWER_BYTES)
                return _result_from(request, answer, blobs, read_mix)
            except JobTimeout:
                if within.expired:
                    return request.failed(_out_of_time_message(within), started)
                return request.failed(_deadline_message(self.deadline_s), started)
            except WorkerCrashed as exc:
                if self._interrupted.is_set():
                    return request.failed("compile interrupted: the call was cancelled", started)
                if _OUT_OF_MEMORY.search(str(exc)):  # the same source would only hit the limit again
                    return request.failed(f"{out_of_memory_message(COMPILE_MEMORY_BYTES)}\n"
                                          f"the compiler process died ({_short(exc)})", started)
                if retries:
                    retries -= 1
                    continue
                return request.failed(f"compile failed: the compiler process died ({_short(exc)})", started)
            except WorkerError as exc:
                return request.failed(f"compile failed: the compiler process is not usable ({_short(exc)})",
                                      started)
            except _Malformed as exc:
                self.worker.kill()  # it no longer behaves like the worker we started
                return request.failed(f"compile failed: the compiler process sent a malformed answer ({exc})",
                                      started)


def _deadline_message(deadline_s: float) -> str:
    return (f"compile killed after {deadline_s:g} s (deadline): NVRTC did not finish in time. Deep or wide "
            "template instantiation, large constexpr evaluation or heavy unrolling can cause this.")


def _out_of_time_message(within: Deadline, what: str = "NVRTC") -> str:
    return (f"compile stopped: the call's {within.seconds:g} s ran out before {what} finished (the compile's own "
            "deadline had not passed); compile it again with compile_kernel, which has a call of its own")


def _short(detail: object) -> str:
    text = str(detail)
    return text if len(text) <= MAX_WORKER_DETAIL_CHARS else text[:MAX_WORKER_DETAIL_CHARS] + " [...]"


# ---------------------------------------------------------------- reading an answer

def _result_from(request: _Request, answer: dict, blobs: list[bytes], read_mix: bool = True) -> CompileResult:
    """The worker's answer as a CompileResult, after checking it field by field against the request (with its
    instruction mix where `read_mix`, else without)."""
    status = answer.get("status")
    if status == Status.REFUSED:
        raise CompileRefused(_short(answer.get("detail")))
    if status == Status.ERROR:
        raise _Malformed(f"{answer.get('error')}: {_short(answer.get('detail'))}")
    if status != Status.OK:
        raise _Malformed(f"unknown status {str(status)[:40]!r}")
    if len(blobs) != 1:
        raise _Malformed(f"{len(blobs)} blobs instead of one CUBIN")
    result = _parse_result(answer.get("result"))
    _check_matches(request, result)
    _check_output(result, blobs[0], read_mix)
    return result.model_copy(update={"cubin": blobs[0]})


def _mix_from(answer: dict) -> tuple[InstructionMix | None, str]:
    """A read_mix answer: (the mix, "") or (None, why the disassembler could not read the CUBIN)."""
    if answer.get("status") == Status.ERROR:
        raise _Malformed(f"{answer.get('error')}: {_short(answer.get('detail'))}")
    if answer.get("status") != Status.OK or len(set(answer) & {"mix", "unreadable"}) != 1:
        raise _Malformed("not the answer to read_mix")
    if "unreadable" in answer:
        return None, _short(answer["unreadable"])
    try:
        return InstructionMix.model_validate_json(json.dumps(answer["mix"]), strict=True), ""
    except (ValidationError, ValueError) as exc:
        raise _Malformed(f"the mix is not a valid InstructionMix: {exc.__class__.__name__}") from None


def _parse_result(document: object) -> CompileResult:
    if not isinstance(document, dict) or set(document) != _RESULT_FIELDS:
        raise _Malformed("the result does not have exactly the fields of a CompileResult")
    try:
        # Strict: no coercion, so "ok": 1 or "ok": "true" is refused rather than read as True.
        return CompileResult.model_validate_json(json.dumps(document), strict=True)
    except (ValidationError, ValueError) as exc:
        raise _Malformed(f"the result is not a valid CompileResult: {exc.__class__.__name__}") from None


def _check_matches(request: _Request, result: CompileResult) -> None:
    expected = {"kernel_name": request.kernel_name, "arch": request.target, "options": request.options,
                "key": request.key, "nvrtc_version": request.nvrtc_version, "cache_hit": False}
    for name, value in expected.items():
        if getattr(result, name) != value:
            raise _Malformed(f"{name} is not the requested one")


def _check_output(result: CompileResult, cubin: bytes, read_mix: bool = True) -> None:
    if len(result.full_log) > MAX_FULL_LOG_CHARS:
        raise _Malformed(f"a log of {len(result.full_log)} characters")
    if result.log != trim_log(result.full_log):
        raise _Malformed("the trimmed log is not the full log trimmed")
    if not math.isfinite(result.compile_ms) or result.compile_ms < 0:
        raise _Malformed("an impossible compile time")
    if len(cubin) > MAX_CUBIN_BYTES:
        raise _Malformed(f"a CUBIN of {len(cubin)} bytes")
    if result.ok and (not cubin.startswith(ELF_MAGIC) or not result.lowered_name):
        raise _Malformed("ok without an ELF CUBIN and a lowered name")
    if not result.ok and (cubin or result.resources is not None or result.mix is not None):
        raise _Malformed("a failed compile with a CUBIN, a resource report or an instruction mix")
    if result.ok and read_mix and result.mix is None:  # the policy of a task's arithmetic is judged from it
        raise _Malformed("ok without the CUBIN's instruction mix")
    if not read_mix and result.mix is not None:
        raise _Malformed("an instruction mix that was to be read apart")
