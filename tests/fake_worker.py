"""A stand-in GPU worker speaking the real wire protocol, for CPU tests of the pool.

Jobs carry a "behaviour": echo (answer with the blobs reversed), hang, crash, spawn-and-hang
(leaves a grandchild in the process group), fault (answers a sticky fault, then exits), too_slow
(answers that a launch outran its limit, then hangs as its kernel would), probe (tries to read a
path and to open a TCP connection, to check confinement from outside).

Like the real worker it applies a --confine=JSON spec first, and says so in its 'ready' message.
"""

import os
import socket
import subprocess
import sys
import time

from sandbox import wire
from harness.worker_side.gpu_worker_main import confine_from_argv, regions_from_argv


def main(argv):
    flags = {a for a in argv[1:] if a.startswith("--")}
    fds = [a for a in argv[1:] if not a.startswith("--")]
    jobs = os.fdopen(int(fds[0]), "rb")
    answers = os.fdopen(int(fds[1]), "wb")
    if "--fail-start" in flags:
        wire.send(answers, {"status": "startup_error", "error": "CUDA_ERROR_NO_DEVICE", "detail": "no device"})
        return 4
    confined = confine_from_argv(argv)
    if "--pretend-unconfined" in flags:
        confined["confined"] = False
    # --pipe-only: a worker that ignores the shared regions (the parent must fall back to the pipe)
    regions = (None, None) if "--pipe-only" in flags else regions_from_argv(argv)
    wire.send(answers, {"status": "ready", "device": {"name": "fake"}, "arch": "sm_90", "event_overhead_ms": 0.002,
                        "pid": os.getpid(), "env": sorted(os.environ),
                        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "shared_regions": regions[0] is not None,
                        **confined})
    while True:
        try:
            header, blobs = wire.receive(jobs, 1 << 30, regions[0])
        except wire.PeerClosed:
            return 0
        behaviour = header.get("behaviour")
        if header.get("op") == "exit":
            return 0
        if behaviour == "hang":
            time.sleep(3600)
        if behaviour == "spawn-and-hang":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            wire.send(answers, {"status": "ok", "child": child.pid}, [])
            time.sleep(3600)
        if behaviour == "crash":
            os._exit(9)
        if behaviour == "probe":
            wire.send(answers, {"status": "ok", "read": _can_read(header["path"]),
                                "connect": _can_connect(header["port"])})
            continue
        if behaviour == "too_slow":
            wire.send(answers, {"status": "too_slow", "error": "TOO_SLOW", "detail": "launch 1 ran on"})
            time.sleep(3600)
        if behaviour == "fault":
            wire.send(answers, {"status": "fault", "error": "CUDA_ERROR_ILLEGAL_ADDRESS", "detail": "boom"})
            return 3
        if behaviour == "bad-region":  # says its blobs are in the region, beyond its end
            wire.send(answers, {"status": "ok", "shm": [1 << 40]})
            continue
        wire.send(answers, {"status": "ok", "pid": os.getpid(), "in_region": any(isinstance(b, memoryview) for b in blobs)},
                  [bytes(b) for b in reversed(blobs)], regions[1])


def _can_read(path):
    try:
        with open(path, "rb") as file:
            file.read(1)
        return True
    except OSError:
        return False


def _can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv))
