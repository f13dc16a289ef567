"""A new compile's instruction mix read apart from it (harness/compile_service.py `read_mix=False`, then `read_mix`),
in the real compile worker, and record_attempt reading it while the kernel is checked and its references are timed
(server/mix_reading.py, server/attempt.py): the arithmetic rule still judged before the kernel is timed, an
unreadable CUBIN still a failed compile, a cache hit not read again."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.compile_cache import CompileCache
from harness.call_limits import OutOfTime
from harness.compile_service import CompileService
from harness.results import ReasonCode
from sandbox.confine import unavailable_reason
from server.attempt import record_attempt
from server.record_files import iter_events
from server.run import RunSettings
from tests.fake_executor import FakeExecutor
from tests.server_support import kernel, new_run
from tests.test_arithmetic import SPLIT, SPLIT_LAUNCH

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sass"
CONFINE = unavailable_reason() is None
BF16 = (FIXTURES / "mma_bf16.cu").read_text()


def test_a_compile_without_its_mix_is_read_after_and_only_then_cached(tmp_path):
    with CompileService(confine=CONFINE, cache=CompileCache(folder=tmp_path)) as service:
        early = service.compile(BF16, "mma_bf16", (), "sm_90", read_mix=False)
        assert early.ok and early.mix is None and not early.cache_hit
        again = service.compile(BF16, "mma_bf16", (), "sm_90", read_mix=False)
        assert not again.cache_hit and again.mix is None  # nothing cached without its mix
        whole = service.read_mix(early)
        assert whole.ok and whole.mix.tensor_forms == ["HMMA.16816.F32.BF16"] and whole.cubin == early.cubin
        hit = service.compile(BF16, "mma_bf16", (), "sm_90", read_mix=False)
        assert hit.cache_hit and hit.mix == whole.mix  # cached with its mix: nothing left to read
        assert service.read_mix(hit) is hit
        one_job = service.compile(BF16, "mma_bf16", (), "sm_90")
        assert one_job.mix == whole.mix
        assert service.worker.alive


def test_a_cubin_the_disassembler_cannot_read_fails_the_compile_and_is_not_cached(tmp_path):
    with CompileService(confine=CONFINE, cache=CompileCache(folder=tmp_path)) as service:
        early = service.compile(BF16, "mma_bf16", (), "sm_90", read_mix=False)
        broken = service.read_mix(early.model_copy(update={"cubin": b"\x7fELF" + b"\x00" * 200}))
        assert not broken.ok and broken.cubin == b"" and broken.resources is None
        assert broken.log.startswith("the compiled kernel's instructions could not be read: ") and "nvdisasm" in broken.log
        assert service.compile(BF16, "mma_bf16", (), "sm_90", read_mix=False).mix is None
        assert service.worker.alive  # the worker answered: it stays


class ReadsMixApart(FakeExecutor):
    """The fake with GpuExecutor's split compile: the mix of a new compile comes from read_mix, which ends only
    once the checks are over and a reference's timing has begun (it waits for that), so a test sees the reading
    overlap both; `unreadable`: the disassembler refuses every CUBIN."""

    def __init__(self, *args, unreadable: bool = False, out_of_time: bool = False,
                 reference_out_of_time: bool = False, **options):
        super().__init__(*args, **options)
        self.unreadable, self.out_of_time, self.reference_out_of_time = unreadable, out_of_time, reference_out_of_time
        self.checking, self.timing_a_reference = threading.Event(), threading.Event()
        self.events: list[str] = []
        self._mixes: dict[bytes, object] = {}
        self._seen: set[bytes] = set()

    def compile(self, source, options, read_mix: bool = True):
        result = super().compile(source, options)
        if read_mix or not result.ok:
            return result
        if result.cubin in self._seen:  # as the compile cache answers a source compiled and read before
            return result.model_copy(update={"cache_hit": True})
        self.events.append("compiled without its mix")
        self._mixes[result.cubin] = result.mix
        return result.model_copy(update={"mix": None})

    def read_mix(self, compiled):
        checked = self.checking.wait(30)
        beside_a_timing = self.timing_a_reference.wait(30)
        self.events.append("mix read" + (" during the checks" if checked else "")
                           + (" and a reference's timing" if beside_a_timing else ""))
        if self.unreadable:
            log = "the compiled kernel's instructions could not be read: nvdisasm failed (fake)"
            return compiled.model_copy(update={"ok": False, "log": log, "full_log": log, "cubin": b"", "resources": None})
        self._seen.add(compiled.cubin)
        return compiled.model_copy(update={"mix": self._mixes[compiled.cubin]})

    def check(self, kernel, cases, seeds=None, against_oracle=False):
        self.events.append("check")
        self.checking.set()
        if self.out_of_time:
            self.timing_a_reference.set()  # no timing follows: the reading may end
            raise OutOfTime("the call's deadline passed while the check ran (fake)")
        return super().check(kernel, cases, seeds, against_oracle)

    def time(self, kernel, cases):
        candidate = kernel.cubin in self._mixes
        self.events.append("time candidate" if candidate else "time reference")
        if not candidate:
            self.timing_a_reference.set()
            if self.reference_out_of_time:
                raise OutOfTime("the call's deadline passed while the baseline was timed (fake)")
        return super().time(kernel, cases)


def _run(tmp_path, **options):
    run = new_run(tmp_path)
    executor = ReadsMixApart(run.task, **options)
    run.executor = executor
    return run, executor


def test_an_attempt_s_mix_is_read_while_it_is_checked_and_before_it_is_timed(tmp_path):
    run, executor = _run(tmp_path)
    try:
        answer = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "faster", None, None)
        assert answer.verdict == "valid-faster", answer.reasons
        events = executor.events
        read = "mix read during the checks and a reference's timing"
        assert events[:4] == ["compiled without its mix", "check", "check", "time reference"], events
        assert read in events and events.index("time candidate") > events.index(read), events
        entry = run.history[-1]
        assert entry.compile.mix is not None and entry.compile.mix.fp32 > 0 and answer.mix == entry.compile.mix
        compiled = [e.data for e in iter_events(run.dir) if e.kind == "compiled"]
        assert compiled and compiled[-1]["ok"] is True
        # The same source again is a cache hit: nothing left to read
        executor.events.clear()
        again = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "again", None, None)
        assert again.mix == answer.mix and not any(e.startswith("mix read") for e in executor.events)
    finally:
        run.close()


def test_a_kernel_on_units_its_task_forbids_is_checked_meanwhile_but_never_timed(tmp_path):
    run, executor = _run(tmp_path)
    try:
        used = run.attempts_used
        answer = record_attempt(run, run.candidate(None, SPLIT, None, SPLIT_LAUNCH), "fp16 tensor cores", None, None)
        assert answer.verdict == "rejected"
        assert [r.code for r in answer.reasons] == [ReasonCode.ARITHMETIC_NOT_ALLOWED], answer.reasons
        assert answer.mix.tensor == {"fp16": 3} and run.attempts_used == used + 1
        assert "time candidate" not in executor.events and run.history[-1].timing is None
        assert "mix read during the checks and a reference's timing" in executor.events, executor.events
    finally:
        run.close()


def test_an_unreadable_cubin_is_a_compile_error_and_is_never_timed(tmp_path):
    run, executor = _run(tmp_path, unreadable=True)
    try:
        answer = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "unreadable", None, None)
        assert answer.verdict == "rejected"
        assert [r.code for r in answer.reasons] == [ReasonCode.COMPILE_ERROR], answer.reasons
        assert "instructions could not be read" in answer.reasons[0].detail
        assert "time candidate" not in executor.events and run.history[-1].timing is None
        compiled = [e.data for e in iter_events(run.dir) if e.kind == "compiled"]
        assert compiled[-1]["ok"] is False
        log = (run.dir / "compile-logs" / f"{run.history[-1].candidate}.log").read_text()
        assert "instructions could not be read" in log
    finally:
        run.close()


def test_a_kernel_its_checks_reject_on_forbidden_units_is_refused_for_its_units_and_nothing_is_timed(tmp_path):
    run, executor = _run(tmp_path)
    executor.timing_a_reference.set()  # no timing comes: the reading need not wait for one
    try:
        wrong = SPLIT + "\n// fake: wrong\n"  # its checks find mismatches
        answer = record_attempt(run, run.candidate(None, wrong, None, SPLIT_LAUNCH), "wrong and forbidden", None, None)
        assert [r.code for r in answer.reasons] == [ReasonCode.ARITHMETIC_NOT_ALLOWED], answer.reasons
        assert not any(e.startswith("time") for e in executor.events), executor.events
    finally:
        run.close()


@pytest.mark.parametrize("where", ["out_of_time", "reference_out_of_time"])  # during its checks; its references' timing
def test_an_attempt_out_of_time_while_its_mix_is_read_still_records_its_instructions(tmp_path, where):
    run, executor = _run(tmp_path, **{where: True})
    try:
        answer = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "slow", None, None)
        assert answer.verdict == "rejected" and [r.code for r in answer.reasons] == [ReasonCode.TIMEOUT]
        assert "time candidate" not in executor.events
        entry = run.history[-1]
        assert entry.compile.ok and entry.compile.mix is not None and entry.compile.mix.fp32 > 0
        compiled = [e.data for e in iter_events(run.dir) if e.kind == "compiled"]
        assert compiled and compiled[-1]["ok"] is True  # the compile is in the audit log, noted once read
    finally:
        run.close()


def test_a_kernel_on_forbidden_units_whose_references_run_out_of_time_is_refused_for_its_units(tmp_path):
    run, executor = _run(tmp_path, reference_out_of_time=True)
    try:
        answer = record_attempt(run, run.candidate(None, SPLIT, None, SPLIT_LAUNCH), "forbidden", None, None)
        assert [r.code for r in answer.reasons] == [ReasonCode.ARITHMETIC_NOT_ALLOWED], answer.reasons
        assert "time candidate" not in executor.events
    finally:
        run.close()


def test_a_run_times_at_least_one_round():
    with pytest.raises(ValidationError, match="timing_rounds"):
        RunSettings(timing_rounds=0)
