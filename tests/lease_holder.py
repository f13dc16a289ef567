"""Another process holding a GPU's lease (harness/gpu_lease.py), for tests of processes that wait for it.

`python tests/lease_holder.py GPU WHAT [serving]` takes the lease of GPU as WHAT ("bench") (with `serving`: the
GPU's serving claim, as a serving run holds it), prints "held" and holds it until a line (or EOF) arrives on its stdin. `LeaseHolder` starts one and waits until it holds the lease.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.gpu_lease import GpuLease, ServingClaim  # noqa: E402


class LeaseHolder:
    """The holder process: it holds the lease once constructed; `release()` lets it go, `kill()` SIGKILLs it."""

    def __init__(self, gpu: str, what: str, serving: bool = False):
        self.process = subprocess.Popen([sys.executable, __file__, gpu, what, *(["serving"] if serving else [])],
                                        stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline() == "held\n"
        self.pid = self.process.pid

    def release(self) -> None:
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        assert self.process.wait(timeout=30) == 0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self.process.stdin.close()
        self.process.stdout.close()


def main(gpu: str, what: str, serving: bool) -> None:
    if serving:
        assert ServingClaim(gpu, what).try_take()
        print("held", flush=True)
        sys.stdin.readline()
        return
    with GpuLease(gpu, what).held():
        print("held", flush=True)
        sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["serving"])
