"""Worker confinement, with real Landlock: a confined child tries what a hostile worker would."""

import dataclasses
import json
import re
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import confine, grants
from sandbox.environment import worker_environment
from harness.gpu_workers import GPU_WORKER_COMMAND
from harness.worker_side.nvrtc import include_folders
from sandbox.pool import Worker, WorkerError

REPO = Path(__file__).resolve().parent.parent
FAKE = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))
needs_landlock = pytest.mark.skipif(
    confine.landlock_abi() < 4, reason=f"needs Landlock ABI >= 4: {confine.unavailable_reason()}")

# The child confines itself first (before numpy starts threads), then reports what it could do.
CHILD = r"""
import json, os, resource, socket, sys
from sandbox import confine

from pathlib import Path
from sandbox import grants
# "compile-worker": the spec the compile worker builds for itself, in its own process and environment
spec = grants.compile_worker_confinement(Path.cwd()) if sys.argv[1] == "compile-worker" else \
    confine.Confinement.from_json(sys.argv[1])
probe = json.loads(sys.argv[2])
notes = confine.apply(spec)

def attempt(action):
    try:
        action()
        return True
    except OSError:
        return False

def read(path):
    with open(path, "rb") as file:
        file.read(1)

def write(path):
    with open(path, "w") as file:
        file.write("x")

def connect():
    socket.create_connection(("127.0.0.1", probe["port"]), timeout=2).close()

def nvrtc_compile():
    from harness.worker_side.nvrtc import compile_kernel
    source = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }'
    return compile_kernel(source, "twice", arch="sm_90").ok

def compile_a_kernel():
    import numpy  # a GPU worker's imports; numpy starts threads, so a narrowing child does without
    from cuda.bindings import nvrtc
    return nvrtc_compile()

if probe["narrow"]:  # as the compile worker does: limit memory, load NVRTC, then keep only what compiling reads
    from harness.worker_side.compile_policy import COMPILE_MEMORY_BYTES
    confine.limit_address_space(COMPILE_MEMORY_BYTES)
    nvrtc_compile()
    confine.narrow(confine.Confinement.from_json(probe["narrow"]))

report = {
    "notes": notes,
    "read": {path: attempt(lambda: read(path)) for path in probe["read"]},
    "list": {path: attempt(lambda: os.listdir(path)) for path in probe["list"]},
    "write": {path: attempt(lambda: write(path)) for path in probe["write"]},
    "connect": attempt(connect),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "env": sorted(os.environ),
    "compiled": (nvrtc_compile() if probe["narrow"] else compile_a_kernel()) if probe["compile"] else None,
}
print(json.dumps(report))
"""


@pytest.fixture
def listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A scratch folder, a results folder beside it, and secrets in the parent's environment."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("KERNEL_REFEREE_TOKEN", "secret")
    (tmp_path / "scratch").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text("{}")
    return tmp_path


def run_confined(spec: confine.Confinement | str, scratch: Path, **probe) -> dict:
    probe = {"read": [], "list": [], "write": [], "port": 9, "compile": False, "narrow": None, **probe}
    spec_text = spec if isinstance(spec, str) else spec.to_json()
    done = subprocess.run([sys.executable, "-c", CHILD, spec_text, json.dumps(probe)],
                          capture_output=True, text=True, timeout=120, cwd=scratch,
                          env=worker_environment(scratch))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_landlock_availability_is_reported_consistently():
    reason = confine.unavailable_reason()
    assert (reason is None) == (confine.landlock_abi() >= 4)
    assert reason is None or "--no-sandbox" in reason


def test_a_confinement_survives_its_json_form(tmp_path):
    spec = grants.gpu_worker_confinement(tmp_path)
    assert confine.Confinement.from_json(spec.to_json()) == spec


def test_python_paths_grant_the_packages_but_not_the_checkout():
    paths = grants.python_paths()
    assert str(REPO / "harness") in paths and str(REPO / "sandbox") in paths
    assert str(REPO) not in paths
    assert not any(p == str(REPO / "tests") or p.startswith(str(REPO / "tests") + "/") for p in paths)
    assert all(p == os.path.realpath(p) for p in paths)


def test_cuda_paths_are_existing_folders():
    assert all(os.path.isdir(p) for p in grants.cuda_paths())


@needs_landlock
def test_the_compile_worker_reaches_only_python_cuda_and_its_scratch(places, listener):
    scratch = places / "scratch"
    report = run_confined(
        grants.compile_worker_confinement(scratch), scratch, port=listener, compile=True,
        read=["/etc/passwd", str(places / "results" / "summary.json"), __file__,
              f"/proc/{os.getpid()}/environ"],
        list=[str(Path.home())],
        write=[str(scratch / "inside.txt"), str(places / "outside.txt")])
    assert report["read"] == {"/etc/passwd": False, str(places / "results" / "summary.json"): False,
                              __file__: False, f"/proc/{os.getpid()}/environ": False}
    assert report["list"] == {str(Path.home()): False}
    assert report["write"] == {str(scratch / "inside.txt"): True, str(places / "outside.txt"): False}
    assert report["connect"] is False
    assert report["compiled"] is True
    _assert_limits_and_environment(report)


@needs_landlock
def test_the_compile_worker_narrowed_after_loading_nvrtc_reads_only_the_headers(places):
    scratch = places / "scratch"
    headers = include_folders()
    loaded = grants.compile_worker_loaded_confinement(scratch, headers)
    # A second layer cannot grant what the first did not: /etc/passwd stays out of reach.
    widened = dataclasses.replace(loaded, read_only=loaded.read_only + ("/etc/passwd",))
    worker_files = ["/proc/self/environ", "/proc/self/maps", "/proc/self/mounts", "/proc/self/cmdline",
                    "/proc/self/status", "/etc/os-release", "/etc/ld.so.cache", "/etc/passwd", sys.executable]
    header = str(Path(headers[0]) / "cuda_fp16.h")
    report = run_confined("compile-worker", scratch, compile=True,
                          narrow=widened.to_json(), read=worker_files + [header],
                          write=[str(scratch / "inside.txt")])
    assert report["read"] == {**{path: False for path in worker_files}, header: True}
    assert report["write"] == {str(scratch / "inside.txt"): True}
    assert report["compiled"] is True


@needs_landlock
def test_the_gpu_worker_cannot_see_results_home_tests_or_the_parent(places, listener):
    scratch = places / "scratch"
    report = run_confined(
        grants.gpu_worker_confinement(scratch), scratch, port=listener,
        read=[str(places / "results" / "summary.json"), __file__, str(REPO / "README.md"),
              f"/proc/{os.getpid()}/environ", "/etc/passwd", "/proc/self/status",
              str(REPO / "sandbox" / "wire.py")],
        list=[str(Path.home()), str(REPO / "tests")],
        write=[str(scratch / "inside.txt"), str(places / "outside.txt")])
    assert report["read"] == {str(places / "results" / "summary.json"): False, __file__: False,
                              str(REPO / "README.md"): False, f"/proc/{os.getpid()}/environ": False,
                              "/etc/passwd": False, "/proc/self/status": True,
                              str(REPO / "sandbox" / "wire.py"): True}
    assert report["list"] == {str(Path.home()): False, str(REPO / "tests"): False}
    assert report["write"] == {str(scratch / "inside.txt"): True, str(places / "outside.txt"): False}
    assert report["connect"] is False
    _assert_limits_and_environment(report)


@needs_landlock
def test_landlock_alone_refuses_tcp_without_a_new_network(places, listener):
    scratch = places / "scratch"
    spec = dataclasses.replace(grants.compile_worker_confinement(scratch), new_network=False)
    assert run_confined(spec, scratch, port=listener)["connect"] is False


def _assert_limits_and_environment(report: dict) -> None:
    assert report["core"] == [0, 0]
    assert report["fsize"] == [1 << 30, 1 << 30]
    assert report["nofile"][1] <= 256
    assert "ANTHROPIC_API_KEY" not in report["env"] and "KERNEL_REFEREE_TOKEN" not in report["env"]


@needs_landlock
def test_apply_refuses_once_a_second_thread_runs():
    code = ("import threading, time\nfrom sandbox import confine\n"
            "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "try:\n    confine.apply(confine.Confinement(read_only=(), read_write=()))\n"
            "except confine.ConfinementError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "before a second thread starts" in done.stdout


@needs_landlock
def test_a_profiled_worker_s_spec_lets_the_profiler_s_earlier_threads_be_and_names_them(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for a worker")
    spec = grants.profiled_gpu_worker_confinement(tmp_path / "scratch")
    assert spec.earlier_threads and not grants.gpu_worker_confinement(tmp_path / "scratch").earlier_threads
    code = ("import sys, threading, time\nfrom sandbox import confine\n"
            "threading.Thread(target=time.sleep, args=(5,), name='injected', daemon=True).start()\n"
            "notes = confine.apply(confine.Confinement.from_json(sys.argv[1]))\n"
            "try:\n    open(sys.argv[2]).read()\n    print('read')\nexcept PermissionError:\n    print('refused')\n"
            "print(notes)\n")
    done = subprocess.run([sys.executable, "-c", code, spec.to_json(), str(secret)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    refused, notes = done.stdout.splitlines()
    assert refused == "refused"  # the calling thread is confined all the same
    assert "1 threads started before the confinement (by the profiler's library) are not confined" in notes
    assert re.search(r"are not confined: \d+ \(", notes)  # the other thread, by its id and name


# -- through the pool -------------------------------------------------------------------------
@needs_landlock
def test_a_pool_worker_is_confined_by_default(listener):
    with Worker("test", command=FAKE, startup_timeout_s=30) as worker:
        assert worker.ensure_started()["confined"] is True
        answer, _ = worker.call({"op": "run", "behaviour": "probe", "path": __file__, "port": listener},
                                [], 10, 1 << 20)
    assert answer["read"] is False and answer["connect"] is False


def test_the_opt_out_starts_an_unconfined_worker(listener):
    with Worker("test", command=FAKE, startup_timeout_s=30, confine=False) as worker:
        assert worker.ensure_started()["confined"] is False
        answer, _ = worker.call({"op": "run", "behaviour": "probe", "path": __file__, "port": listener},
                                [], 10, 1 << 20)
    assert answer["read"] is True and answer["connect"] is True


@needs_landlock
def test_a_worker_that_does_not_confine_itself_is_not_used():
    worker = Worker("test", command=FAKE + ("--pretend-unconfined",), startup_timeout_s=30)
    with pytest.raises(WorkerError, match="asked to confine itself"):
        worker.start()
    assert not worker.alive


def test_the_real_worker_reports_a_spec_it_cannot_apply():
    command = (sys.executable, "-m", "harness.worker_side.gpu_worker_main", "--confine=[1, 2]")
    worker = Worker("test", command=command, startup_timeout_s=60, confine=False)
    with pytest.raises(WorkerError, match="ConfinementError: the worker could not be confined"):
        worker.start()


@pytest.mark.gpu
@needs_landlock
def test_a_confined_gpu_worker_creates_its_context():
    with Worker("candidate", command=GPU_WORKER_COMMAND, startup_timeout_s=120) as worker:
        hello = worker.ensure_started()
    assert hello["confined"] is True
    assert hello["device"]["name"]
