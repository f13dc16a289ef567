"""What each worker is granted (sandbox/confine.py applies it): the Python install, the CUDA libraries and
headers, the system libraries, device files and its own scratch folder; nothing of the user's home, the task,
the results or the repository's tests."""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import replace
from pathlib import Path

from sandbox.confine import Confinement

_PACKAGES = ("harness", "sandbox", "server")
# A system-wide prefix granted whole would open /usr/include, /usr/bin and more; its library
# folders are on sys.path, which is granted entry by entry.
_SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _project_root() -> str | None:
    """The source checkout this package runs from (an editable install), or None when installed."""
    root = Path(__file__).resolve().parent.parent
    return str(root) if (root / "pyproject.toml").is_file() else None


def _existing(paths) -> list[str]:
    found = []
    for path in paths:
        real = os.path.realpath(path)
        if os.path.exists(real) and real not in found:
            found.append(real)
    return found


def python_paths() -> tuple[str, ...]:
    """The Python install, its sys.path and the referee's own packages, as real paths.

    In an editable install (or under pytest) the repository root is importable, but granting it
    would show a worker the tests (which hold expected values), the tasks and any results folder
    inside the checkout. Only the package folders the worker imports are granted instead; other
    sys.path entries inside the checkout are dropped unless they are inside a prefix (a .venv).
    """
    root = _project_root()
    packages = _existing(Path(__file__).resolve().parent.parent / name for name in _PACKAGES)
    prefixes = [p for p in _existing((sys.prefix, sys.base_prefix, sys.exec_prefix)) if p not in _SYSTEM_PREFIXES]
    keep = []
    for entry in _existing(e for e in sys.path if e):   # '' is the caller's cwd, not the worker's
        if entry in _SYSTEM_PREFIXES:
            continue
        if root and (_inside(root, entry) or _inside(entry, root)):
            if not any(_inside(entry, allowed) for allowed in prefixes + packages):
                continue
        keep.append(entry)
    return tuple(dict.fromkeys(prefixes + keep + packages))


def cuda_paths() -> tuple[str, ...]:
    """Folders the CUDA headers NVRTC includes and the CUDA libraries come from."""
    found = []
    try:
        from cuda import pathfinder  # optional: without the CUDA wheels there are no such folders
        for library in ("cudart", "cccl"):
            try:
                found.append(pathfinder.find_nvidia_header_directory(library))
            except Exception:  # noqa: BLE001 - a missing header set is not needed by every kernel
                pass
    except ImportError:
        pass
    found += _loaded_cuda_library_folders()
    found += sorted(glob.glob("/usr/local/cuda*"))
    return tuple(_existing(p for p in found if p))


def _loaded_cuda_library_folders() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if name.startswith(("libnvrtc", "libcuda.so", "libnvJitLink")):
            folders.append(os.path.dirname(os.path.realpath(path)))
    return folders


# /proc and /etc are granted entry by entry. Landlock alone does not keep a worker out of another
# process's /proc/<pid>/environ on every kernel (seen readable on Linux 6.18: the server's keys),
# and /etc holds the host's credentials (/etc/shadow, ssh host keys) for a worker running as root.
_PROC_SHARED = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/devices", "/proc/modules",
                "/proc/driver", "/proc/bus", "/proc/sys", "/proc/filesystems", "/proc/version",
                "/proc/uptime", "/proc/loadavg")
_ETC_LOADER = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
_ETC_GPU = _ETC_LOADER + ("/etc/nvidia", "/etc/localtime")


def gpu_worker_confinement(scratch: Path) -> Confinement:
    """What a GPU worker needs: the system, Python, CUDA, the NVIDIA devices and its scratch.

    /proc/self/task is writable because cuInit fails with CUDA_ERROR_OPERATING_SYSTEM without it
    (seen on an H200); like /proc/self it names the worker's own entry when applied.
    """
    system = _existing(("/usr", "/lib", "/lib64", "/bin", "/sbin", "/opt", "/sys") + _PROC_SHARED + _ETC_GPU)
    devices = sorted(glob.glob("/dev/nvidia*")) + ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/shm"]
    read_only = tuple(dict.fromkeys(system + list(python_paths()) + list(cuda_paths()))) + ("/proc/self",)
    return Confinement(read_only=read_only, read_write=(str(scratch), "/proc/self/task"),
                       devices=tuple(p for p in devices if os.path.exists(p)))


def profiled_gpu_worker_confinement(scratch: Path) -> Confinement:
    """A GPU worker run under Nsight Compute (profile_kernel): the same files, devices and limits, but the
    host's network and IPC, over which the profiler's library in the worker reaches the ncu process that
    started it, and that library's threads, started before the worker could confine itself, are let be (the
    worker's answer notes them). The worker still reads nothing outside the system, Python, CUDA and its
    scratch."""
    return replace(gpu_worker_confinement(scratch), new_network=False, deny_tcp=False, scope_ipc=False,
                   earlier_threads=True)


def compile_worker_confinement(scratch: Path) -> Confinement:
    """What loading NVRTC needs: Python, the CUDA headers and libraries, the system libraries.

    No /etc beyond the loader's cache, no /usr/include, no /proc beyond the worker's own entry, no
    devices but /dev/null and /dev/urandom. The worker narrows this with
    compile_worker_loaded_confinement once NVRTC is loaded, before it compiles a candidate.
    """
    system = _existing(("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib") + _ETC_LOADER)
    read_only = tuple(dict.fromkeys(list(python_paths()) + list(cuda_paths()) + system)) + ("/proc/self",)
    return Confinement(read_only=read_only, read_write=(str(scratch),),
                       devices=tuple(p for p in ("/dev/null", "/dev/urandom") if os.path.exists(p)))


def compile_worker_loaded_confinement(scratch: Path, header_folders: tuple[str, ...],
                                      executable_files: tuple[str, ...] = ()) -> Confinement:
    """What an NVRTC compile needs once NVRTC is loaded and has compiled once: the header folders on its
    include path, and the scratch folder (its working directory, where `#include "x.h"` looks first); and
    `executable_files`, the files of the disassembler the worker runs on each CUBIN (the program, its loader
    and its libraries, each file alone: harness/worker_side/executable_files.py).

    Nothing of /proc, /etc, the system or CUDA library folders nor the Python install: an `#include` of
    /proc/self/environ, /etc/os-release or /etc/ld.so.cache cannot be read (seen with strace: after its
    first compile NVRTC opens only the headers a source includes, and stats /etc/localtime for __DATE__).
    """
    return Confinement(read_only=tuple(_existing(header_folders)) + tuple(_existing(executable_files)),
                       read_write=(str(scratch),),
                       devices=tuple(p for p in ("/dev/null", "/dev/urandom") if os.path.exists(p)))
