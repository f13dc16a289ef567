"""harness.compile_service and harness.worker_side.compile_worker_main: real processes, real NVRTC, real Landlock (no GPU needed)."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.worker_side.compile_policy import (COMPILE_MEMORY_BYTES, MAX_SOURCE_BYTES, CompileRefused,
                                                out_of_memory_message)
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.sass_mix import instruction_mix
from harness.compile_service import DEFAULT_DEADLINE_S, CompileService
from sandbox.confine import unavailable_reason
from sandbox.deadline import Deadline
from sandbox.pool import Worker

ELF_MAGIC = b"\x7fELF"
NO_LANDLOCK = unavailable_reason()
# Tests about deadlines and restarts hold with or without confinement; they confine where the kernel can.
CONFINE = NO_LANDLOCK is None
needs_landlock = pytest.mark.skipif(NO_LANDLOCK is not None, reason=f"needs Landlock: {NO_LANDLOCK}")

GOOD = r"""
extern "C" __global__ void scale(float* x, float f) { x[threadIdx.x] *= f; }
"""

HALF = r"""
#include <cuda_fp16.h>
extern "C" __global__ void scale(__half* x, float f) {
    x[threadIdx.x] = __float2half(__half2float(x[threadIdx.x]) * f);
}
"""

# About 226,000 distinct class instantiations at a recursion depth of 180 (the limit is about 200):
# tens of seconds of NVRTC front-end time (25 s at 50 per side on the development machine).
BOMB = r"""
template <int A, int B, int C> struct T {
    enum : unsigned { v = T<A - 1, B, C>::v + T<A, B - 1, C>::v + T<A, B, C - 1>::v };
};
template <int B, int C> struct T<0, B, C> { enum : unsigned { v = 1 }; };
template <int A, int C> struct T<A, 0, C> { enum : unsigned { v = 1 }; };
template <int A, int B> struct T<A, B, 0> { enum : unsigned { v = 1 }; };
extern "C" __global__ void scale(unsigned* x, float) { x[0] = T<60, 60, 60>::v; }
"""

# Distinct class instantiations, each with 32 members: 2 GiB in about 5 s of CPU time on the
# development machine, where BOMB grows at about 0.15 GB/s.
MEMORY_BOMB = r"""
#define M(i) static constexpr unsigned m##i = A * 64 + B * 8 + C + i;
#define M8(i) M(i##0) M(i##1) M(i##2) M(i##3) M(i##4) M(i##5) M(i##6) M(i##7)
template <int A, int B, int C> struct T {
    M8(1) M8(2) M8(3) M8(4)
    enum : unsigned { v = T<A - 1, B, C>::v + T<A, B - 1, C>::v + T<A, B, C - 1>::v };
};
template <int B, int C> struct T<0, B, C> { enum : unsigned { v = 1 }; };
template <int A, int C> struct T<A, 0, C> { enum : unsigned { v = 1 }; };
template <int A, int B> struct T<A, B, 0> { enum : unsigned { v = 1 }; };
extern "C" __global__ void scale(unsigned* x, float) { x[0] = T<60, 60, 60>::v; }
"""


@pytest.fixture(scope="module")
def confined():
    if NO_LANDLOCK is not None:
        pytest.skip(f"needs Landlock: {NO_LANDLOCK}")
    with CompileService(confine=True) as service:
        yield service


def _leaked_lines(text: str, result) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [line for line in lines if line in result.log or line in result.full_log]


# ---------------------------------------------------------------- compiling

def test_a_good_kernel_compiles_and_a_repeat_is_a_cache_hit_without_the_worker():
    with CompileService(confine=CONFINE) as service:
        first = service.compile(GOOD, "scale", ["--use_fast_math"], "sm_90")
        assert first.ok and not first.cache_hit
        assert first.cubin.startswith(ELF_MAGIC)
        assert first.resources is not None and first.resources.registers > 0
        assert first.options == ("--use_fast_math",) and first.arch == "sm_90"
        service.worker.stop()  # a cache hit must not need, nor start, a worker
        second = service.compile(GOOD, "scale", ["--use_fast_math"], "sm_90")
        assert second.ok and second.cache_hit and second.cubin == first.cubin
        assert service.worker.starts == 1 and not service.worker.alive


def test_a_confined_compile_worker_says_so_when_ready(confined):
    hello = confined.start()
    assert hello["status"] == "ready" and hello["confined"] is True
    assert isinstance(hello["notes"], list)


def test_a_confined_compile_still_reads_the_cuda_headers(confined):
    result = confined.compile(HALF, "scale")
    assert result.ok, result.log
    assert result.cubin.startswith(ELF_MAGIC)


def test_a_compile_error_comes_back_as_data(confined):
    result = confined.compile(GOOD.replace("*= f", "*= undefined_thing"), "scale")
    assert not result.ok and result.cubin == b""
    assert "undefined_thing" in result.log


# ---------------------------------------------------------------- what an include can reach

# The compile worker with its include policy turned off (harness/worker_side/include_policy.py), so
# that a candidate's include of a host file reaches NVRTC: what it shows is up to the confinement.
UNCHECKED_WORKER = (sys.executable, "-c", "import sys\n"
                    "import harness.worker_side.include_policy as policy\n"
                    "policy.check_includes = lambda source: None\n"
                    "from harness.worker_side import compile_worker_main\n"
                    "sys.exit(compile_worker_main.main(sys.argv))\n")
# What the worker's own files showed through #include before its confinement was narrowed (issue 20),
# with a piece of each file's contents (the files in /etc start as they do for this process).
WORKER_FILES = {"/proc/self/environ": "PATH=", "/proc/self/maps": " r-xp ", "/proc/self/mounts": " /proc proc ",
                "/proc/self/cmdline": f"{sys.executable} -c",
                **{path: Path(path).read_bytes()[:8].decode("ascii", "replace")
                   for path in ("/etc/os-release", "/etc/ld.so.cache") if Path(path).exists()}}


@pytest.fixture(scope="module")
def unchecked():
    """A confined compile worker that compiles whatever it is sent."""
    if NO_LANDLOCK is not None:
        pytest.skip(f"needs Landlock: {NO_LANDLOCK}")
    with Worker("compile", command=UNCHECKED_WORKER, confine=True, startup_timeout_s=60) as worker:
        assert worker.ensure_started()["confined"] is True
        yield worker


def _unchecked_log(worker: Worker, source: str) -> str:
    job = {"op": "compile", "source": source, "kernel_name": "scale", "options": [], "arch": "sm_90"}
    answer, _ = worker.call(job, [], 60, 64 << 20)
    assert answer["status"] == "ok", answer
    assert not answer["result"]["ok"]
    return answer["result"]["full_log"]


@pytest.mark.parametrize("path", sorted(WORKER_FILES))
def test_an_include_of_the_workers_own_files_is_refused_and_unreadable_when_not(confined, unchecked, path):
    source = f'#include "{path}"\n' + GOOD
    with pytest.raises(CompileRefused, match="absolute path"):
        confined.compile(source, "scale")
    log = _unchecked_log(unchecked, source)
    assert f'cannot open source file "{path}"' in log
    assert f"{path}(" not in log  # NVRTC parsed none of the file's lines
    assert WORKER_FILES[path] not in log


def test_the_same_includes_show_the_files_in_a_worker_that_is_not_confined():
    with Worker("compile", command=UNCHECKED_WORKER, confine=False, startup_timeout_s=60) as worker:
        for path, contents in WORKER_FILES.items():
            log = _unchecked_log(worker, f'#include "{path}"\n' + GOOD)
            assert f"{path}(1)" in log and contents in log, path


def test_an_include_of_etc_passwd_is_refused_and_does_not_show_its_lines(confined, unchecked):
    passwd = Path("/etc/passwd").read_text()
    with pytest.raises(CompileRefused, match="absolute path"):
        confined.compile('#include "/etc/passwd"\n' + GOOD, "scale")
    log = _unchecked_log(unchecked, '#include "/etc/passwd"\n' + GOOD)
    assert [line for line in passwd.splitlines() if line.strip() and line in log] == []
    assert "root:" not in log


def test_an_include_of_a_users_file_does_not_show_its_secret(unchecked, tmp_path):
    secret = f"referee-secret-{secrets.token_hex(16)}"
    secret_file = tmp_path / "credentials.txt"
    secret_file.write_text(f"api_key = {secret}\n")
    source = f'#include "{secret_file.resolve()}"\n' + GOOD
    with pytest.raises(CompileRefused, match="absolute path"):
        compile_kernel(source, "scale")
    log = _unchecked_log(unchecked, source)
    assert secret not in log and "cannot open source file" in log


@needs_landlock
def test_the_narrowed_worker_still_compiles_what_the_headers_offer(confined):
    source = ("#include <cooperative_groups.h>\n#include <cuda/std/cstdint>\n#include <mma.h>\n" + HALF)
    result = confined.compile(source, "scale")
    assert result.ok, result.log


# ---------------------------------------------------------------- memory

def test_a_memory_bomb_fails_at_the_memory_limit_well_before_the_deadline():
    with CompileService(confine=CONFINE, deadline_s=120.0) as service:
        service.start()
        started = time.monotonic()
        bomb = service.compile(MEMORY_BOMB, "scale")
        elapsed = time.monotonic() - started
        assert not bomb.ok and bomb.cubin == b""
        assert bomb.log.splitlines()[0] == out_of_memory_message(COMPILE_MEMORY_BYTES)
        assert "2 GiB memory limit" in bomb.log
        assert elapsed < DEFAULT_DEADLINE_S
        # The worker survives its compiler's failure and compiles the next source.
        assert service.compile(GOOD, "scale").ok and service.worker.starts == 1


def test_a_back_end_memory_bomb_is_reported_as_such_without_a_retry():
    # A gigabyte of initialized device data: NVVM aborts ("LLVM ERROR: out of memory") at the limit.
    source = '__device__ char big[1 << 30] = {1};\n' + GOOD
    with CompileService(confine=CONFINE, deadline_s=120.0) as service:
        service.start()
        started = time.monotonic()
        result = service.compile(source, "scale")
        assert not result.ok and time.monotonic() - started < DEFAULT_DEADLINE_S
        assert result.log.splitlines()[0] == out_of_memory_message(COMPILE_MEMORY_BYTES)
        assert "the compiler process died" in result.log
        assert service.worker.starts == 1  # the same source would only die again
        assert service.compile(GOOD, "scale").ok


# ---------------------------------------------------------------- deadlines, kills, crashes

def test_a_compile_bomb_is_killed_at_its_deadline_and_the_next_compile_works_in_a_fresh_worker():
    with CompileService(confine=CONFINE, deadline_s=3.0) as service:
        bomb_pid = service.start()["pid"]
        started = time.monotonic()
        bomb = service.compile(BOMB, "scale")
        elapsed = time.monotonic() - started
        assert not bomb.ok and bomb.cubin == b""
        assert "deadline" in bomb.log and "3 s" in bomb.log
        assert 3.0 <= elapsed < 10.0
        assert not service.worker.alive
        after = service.compile(GOOD, "scale")
        assert after.ok and service.worker.starts == 2 and service.worker.pid != bomb_pid


def test_an_interrupted_compile_fails_without_a_retry():
    with CompileService(confine=CONFINE, deadline_s=30.0) as service:
        service.start()
        timer = threading.Timer(1.0, service.interrupt)
        timer.start()
        try:
            started = time.monotonic()
            result = service.compile(BOMB, "scale")
        finally:
            timer.cancel()
        assert not result.ok and "interrupted" in result.log
        assert time.monotonic() - started < 10.0
        assert service.worker.starts == 1


def test_a_compile_worker_killed_between_compiles_is_replaced():
    with CompileService(confine=CONFINE) as service:
        assert service.compile(GOOD, "scale").ok
        killed = service.worker.pid
        os.kill(killed, signal.SIGKILL)
        # Another source, so that the answer cannot come from the cache.
        result = service.compile(GOOD.replace("*=", "+="), "scale")
        assert result.ok and result.cubin.startswith(ELF_MAGIC)
        assert service.worker.pid != killed and service.worker.alive


# ---------------------------------------------------------------- refused before anything starts

def test_an_oversized_source_is_refused_before_any_worker_starts():
    with CompileService(confine=CONFINE) as service:
        with pytest.raises(CompileRefused, match=str(MAX_SOURCE_BYTES)):
            service.compile("/" * (MAX_SOURCE_BYTES + 1), "scale")
        assert service.worker.starts == 0 and service.worker.pid is None


@pytest.mark.parametrize("option", ["-rdc=true", "-I/etc"])
def test_refused_options_are_refused_before_any_worker_starts(option):
    with CompileService(confine=CONFINE) as service:
        with pytest.raises(CompileRefused, match="refused"):
            service.compile(GOOD, "scale", [option])
        assert service.worker.starts == 0 and service.worker.pid is None


# ---------------------------------------------------------------- answers are checked, not trusted

@pytest.fixture(scope="module")
def honest_answer(tmp_path_factory):
    """What a sound compile worker answers for GOOD, built in-process: the result with its CUBIN's mix."""
    result = compile_kernel(GOOD, "scale")
    result = result.model_copy(update={"mix": instruction_mix(result.cubin, tmp_path_factory.mktemp("disassemble"))})
    return {"status": "ok", "result": result.model_dump(mode="json")}, [result.cubin]


def _answering(service: CompileService, answer, blobs, monkeypatch) -> None:
    monkeypatch.setattr(service.worker, "call", lambda *args, **kwargs: (answer, blobs))


def test_an_honest_answer_is_accepted(honest_answer, monkeypatch):
    with CompileService(confine=False) as service:
        _answering(service, *honest_answer, monkeypatch)
        result = service.compile(GOOD, "scale")
        assert result.ok and result.cubin == honest_answer[1][0]


@pytest.mark.parametrize("forge", [
    lambda a, b: ({**a, "result": {**a["result"], "ok": 1}}, b),
    lambda a, b: ({**a, "result": {**a["result"], "ok": "true"}}, b),
    lambda a, b: ({**a, "result": {**a["result"], "ok": False}}, b),
    lambda a, b: (a, [b""]),
    lambda a, b: (a, [b"MZ not an ELF"]),
    lambda a, b: (a, b + b),
    lambda a, b: ({**a, "result": {**a["result"], "key": "0" * 64}}, b),
    lambda a, b: ({**a, "result": {**a["result"], "log": "trust me"}}, b),
    lambda a, b: ({**a, "result": {**a["result"], "cubin": "AAAA"}}, b),
    lambda a, b: ({**a, "status": "done"}, b),
    lambda a, b: ({**a, "result": {**a["result"], "mix": None}}, b),
    lambda a, b: ({**a, "result": {**a["result"], "mix": {**a["result"]["mix"], "fp32": "many"}}}, b),
], ids=["ok-int", "ok-string", "failed-with-cubin", "empty-cubin", "not-elf", "two-blobs", "other-key",
        "forged-log", "extra-field", "unknown-status", "ok-without-mix", "malformed-mix"])
def test_a_malformed_answer_is_a_failed_compile_not_a_cached_one(forge, honest_answer, monkeypatch):
    with CompileService(confine=False) as service:
        _answering(service, *forge(*honest_answer), monkeypatch)
        result = service.compile(GOOD, "scale")
        assert not result.ok and result.cubin == b""
        assert "malformed answer" in result.log
        assert len(service.cache) == 0


def test_a_tool_calls_deadline_caps_the_compile_and_the_next_compile_works():
    # An unrolled kernel NVRTC needs well over 50 ms for, once the worker is up.
    slow = GOOD.replace("{", "{\n#pragma unroll\n for (int r = 0; r < 4096; ++r) x[0] = x[0] * 1.0001f + r;\n", 1)
    with CompileService(confine=CONFINE) as service:
        service.start()
        spent = service.compile(GOOD, "scale", [], "sm_90", within=Deadline(0))
        assert not spent.ok and spent.log.startswith("compile stopped: the call's 0 s ran out")
        assert service.worker.starts == 1  # nothing was sent to the worker
        started = time.monotonic()
        cut = service.compile(slow, "scale", [], "sm_90", within=Deadline(0.05))
        assert time.monotonic() - started < 5
        assert not cut.ok and cut.log.startswith("compile stopped: the call's 0.05 s ran out"), cut.log
        assert service.compile(slow, "scale", [], "sm_90", within=Deadline(None)).ok  # a fresh worker, no limit
