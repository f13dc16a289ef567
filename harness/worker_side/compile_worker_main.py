"""The compile worker: NVRTC on untrusted kernel sources, in a process the parent can confine and kill.

Started by harness/compile_service.py as `python -m harness.worker_side.compile_worker_main JOBS_FD ANSWERS_FD [--confine]`
(a trailing device ordinal, which sandbox.pool.Worker always appends, is ignored). A source can
`#include` any file this process can read, and its compiler errors quote that file's lines back to the
agent; a source can also keep NVRTC busy for minutes. So, asked to, the process confines itself before
it reads its first job, and the parent owns the deadline. Messages use sandbox.wire (JSON + blobs).

sandbox.pool.Worker asks with `--confine=JSON`, a spec built for GPU workers (device files, /etc,
/proc). A compiler needs much less, and /etc would let `#include "/etc/passwd"` through, so the spec
is not used: `--confine` in either form applies compile_worker_confinement, which is what loading
NVRTC needs; once NVRTC is loaded and has compiled the warm-up kernel, a second Landlock layer
(compile_worker_loaded_confinement) leaves only the header folders and the scratch folder, so that
no candidate's `#include` reaches /proc/self or /etc. Confined or not, the address space is limited
(COMPILE_MEMORY_BYTES): a template bomb fails with "out of memory" instead of running to its deadline.

Each CUBIN is then disassembled here (nvdisasm, harness/worker_side/sass_mix.py) into the instruction mix the
answer carries: the disassembler reads a CUBIN an untrusted source shaped, so it runs inside the same
confinement and memory limit, granted only its own files, with a deadline of its own. A compile job may leave
the mix for a second job (`"mix": false`, then op `read_mix` with the CUBIN it answered), so that the parent
can check the kernel on the GPU while its instructions are read.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from harness.worker_side import sass_mix
from harness.worker_side.compile_policy import COMPILE_MEMORY_BYTES, CompileRefused, trim_log, unreadable
from harness.worker_side.executable_files import startup_files
from sandbox import confine, grants, wire
from sandbox.answers import Status

# harness.worker_side.nvrtc (NVRTC, pydantic) is imported only after confinement: Landlock restricts the
# thread that applies it and those it starts later, so no library may start a thread before it.

# A source is at most 256 KiB and the options are few and short; a read_mix job carries one CUBIN (at most
# harness/compile_service.py's MAX_CUBIN_BYTES, 32 MiB); anything larger is not a job.
MAX_JOB_BYTES = 36 << 20
EXIT_STARTUP = 4

_WARM_UP_SOURCE = 'extern "C" __global__ void referee_warm_up(float* x) { x[0] = 1.0f; }'


def _warm_up():
    """Load NVRTC and compile the referee's own kernel, inside the sandbox: a worker that cannot
    compile it (a header or library the confinement hides) fails at start, not on a candidate."""
    from harness.worker_side.nvrtc import compile_kernel  # NVRTC: only once confined

    compiled = compile_kernel(_WARM_UP_SOURCE, "referee_warm_up")
    if not compiled.ok:
        raise RuntimeError(f"NVRTC cannot compile the referee's own warm-up kernel:\n{compiled.log}")
    compiled.model_dump(mode="json")  # what answering a job loads, loaded before the narrowing
    return compiled


def _narrow(confined: bool) -> None:
    """Once NVRTC is loaded: only the header folders, the scratch folder and the disassembler's files stay
    readable. The disassembler's path and version are read now, while its package's metadata still is."""
    from harness.worker_side.nvrtc import include_folders  # NVRTC: only once confined

    disassembler = startup_files(sass_mix.nvdisasm_path())
    sass_mix.nvdisasm_version()
    if confined:
        confine.narrow(grants.compile_worker_loaded_confinement(Path.cwd(), include_folders(), disassembler))


def _with_mix(result):
    """The compile result with its CUBIN's instruction mix; a CUBIN the disassembler cannot read is no result
    the referee can judge: the compile fails, saying why."""
    try:
        return result.model_copy(update={"mix": sass_mix.instruction_mix(result.cubin, Path.cwd())})
    except sass_mix.DisassemblyFailed as exc:
        log = unreadable(str(exc))
        return result.model_copy(update={"ok": False, "log": trim_log(log), "full_log": log, "cubin": b"",
                                         "resources": None})


def _confine(wanted: bool) -> tuple[bool, list[str]]:
    """Confine this process (scratch = its working directory); say whether it is and how."""
    if not wanted:
        return False, ["confinement was not requested"]
    # A kernel without Landlock raises ConfinementError here: asked to confine, the worker does not
    # fall back to compiling unconfined; the operator chooses that with confine=False.
    return True, list(confine.apply(grants.compile_worker_confinement(Path.cwd())))


def _start(answers, wanted: bool) -> bool:
    """Confine, warm up, and send the 'ready' (or 'startup_error') message; True when ready."""
    try:
        confined, notes = _confine(wanted)
        confine.limit_address_space(COMPILE_MEMORY_BYTES)
        warm_up = _warm_up()
        _narrow(confined)
        # The disassembler runs inside the narrowed confinement, or the worker does not start.
        if not (read := _with_mix(warm_up)).ok:
            raise RuntimeError(read.full_log)
        version = warm_up.nvrtc_version
    except Exception as exc:  # noqa: BLE001 - any startup failure is reported, then the process exits
        wire.send(answers, {"status": Status.STARTUP_ERROR, "error": type(exc).__name__, "detail": str(exc)})
        return False
    # sandbox.pool.Worker logs "confinement_notes" and names the worker's device in its log.
    wire.send(answers, {"status": Status.READY, "confined": confined, "notes": notes, "confinement_notes": notes,
                        "pid": os.getpid(), "nvrtc_version": version, "device": {"name": f"NVRTC {version}"}})
    return True


def _compile(header: dict) -> tuple[dict, list[bytes]]:
    from harness.worker_side.nvrtc import compile_kernel  # NVRTC: only once confined

    try:
        result = compile_kernel(header["source"], header["kernel_name"], options=header["options"],
                                arch=header["arch"], toolchain=header.get("toolchain"))
    except CompileRefused as exc:
        return {"status": Status.REFUSED, "detail": str(exc)}, []
    if result.ok and header.get("mix", True):
        result = _with_mix(result)
    # model_dump leaves the CUBIN out (the field is excluded); it travels as the one blob.
    return {"status": Status.OK, "result": result.model_dump(mode="json")}, [result.cubin]


def _read_mix(blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """The instruction mix of the one CUBIN sent (one this worker compiled with `"mix": false`), or why it cannot
    be read."""
    if len(blobs) != 1:
        return {"status": Status.ERROR, "error": "BAD_JOB", "detail": f"{len(blobs)} blobs instead of one CUBIN"}, []
    try:
        mix = sass_mix.instruction_mix(blobs[0], Path.cwd())
    except sass_mix.DisassemblyFailed as exc:
        return {"status": Status.OK, "unreadable": str(exc)}, []
    return {"status": Status.OK, "mix": mix.model_dump(mode="json")}, []


def _answer(header: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    if header.get("op") == "compile":
        return _compile(header)
    if header.get("op") == "read_mix":
        return _read_mix(blobs)
    return {"status": Status.ERROR, "error": "UNKNOWN_OP", "detail": f"unknown op {header.get('op')!r}"}, []


def serve(jobs, answers, wanted_confinement: bool) -> int:
    if not _start(answers, wanted_confinement):
        return EXIT_STARTUP
    while True:
        try:
            header, blobs = wire.receive(jobs, MAX_JOB_BYTES)
        except wire.PeerClosed:
            return 0
        if header.get("op") == "exit":
            return 0
        try:
            answer, blobs = _answer(header, blobs)
        except Exception as exc:  # noqa: BLE001 - a worker bug is reported to the parent, not hidden
            answer, blobs = {"status": Status.ERROR, "error": type(exc).__name__,
                             "detail": traceback.format_exc(limit=5)}, []
        wire.send(answers, answer, blobs)


def main(argv: list[str]) -> int:
    wanted = any(a == "--confine" or a.startswith("--confine=") for a in argv[1:])
    numbers = [a for a in argv[1:] if not a.startswith("--")]
    jobs_fd, answers_fd = int(numbers[0]), int(numbers[1])
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(answers_fd, "wb") as answers:
        return serve(jobs, answers, wanted)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
