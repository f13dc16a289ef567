"""Confining a worker process: Landlock, a new network namespace, rlimits.

A worker runs code the referee did not write (a candidate's device code, compiled by NVRTC, in the
worker's address space), so it is confined to what it needs: the Python install, the CUDA
libraries and headers, its device files and its own scratch folder. Everything else the user can
read (home, the task, the results, the repository's tests, the server's secrets) is out of reach,
and so is the network.

`apply` confines the process that calls it, irreversibly. Landlock restricts only the calling
thread (and what it starts afterwards), so `apply` refuses to run once a second thread exists:
workers call it first thing, before numpy (OpenBLAS) or the CUDA driver start theirs. (A worker
started by Nsight Compute is the exception: the profiler's library starts threads before any of the
worker's code runs; they are let be, and named in the worker's notes.)

Paths are resolved by the process that applies the confinement, so `/proc/self` in a spec built
by the parent names the confined worker itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import stat
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ConfinementError", "Confinement", "landlock_abi", "unavailable_reason", "apply", "narrow",
           "limit_address_space"]


class ConfinementError(RuntimeError):
    """The process could not be confined as asked."""


@dataclass(frozen=True)
class Confinement:
    read_only: tuple[str, ...]          # paths (files or folders) readable and executable
    read_write: tuple[str, ...]         # paths readable and writable (a per-worker scratch folder)
    devices: tuple[str, ...] = ()       # paths read-write with ioctl (NVIDIA device files, /dev/null)
    new_network: bool = True            # unshare(CLONE_NEWNET) where permitted; reported when not
    deny_tcp: bool = True               # Landlock TCP bind/connect handled with no rule (ABI >= 4)
    scope_ipc: bool = True              # no signals to, nor abstract sockets with, processes outside (ABI >= 6)
    file_size_bytes: int = 1 << 30      # RLIMIT_FSIZE
    open_files: int = 256               # RLIMIT_NOFILE
    # Threads already running when it is applied are let be (and stay unconfined: Landlock restricts the calling
    # thread and what it starts): only for a worker started by a profiler, whose library starts them first.
    earlier_threads: bool = False
    # RLIMIT_CORE is always 0: a core dump of a worker holds the inputs and the expected outputs.

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Confinement":
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError(f"a confinement spec is a JSON object, not {type(fields).__name__}")
        for name in ("read_only", "read_write", "devices"):
            fields[name] = tuple(fields.get(name, ()))
        return cls(**fields)


# -- Landlock constants (include/uapi/linux/landlock.h); the syscall numbers are the same on
# every architecture since Linux 5.13.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000

_FS = {name: 1 << bit for bit, name in enumerate((
    "execute", "write_file", "read_file", "read_dir", "remove_dir", "remove_file", "make_char",
    "make_dir", "make_reg", "make_sock", "make_fifo", "make_block", "make_sym", "refer",
    "truncate", "ioctl_dev"))}
_FS_BITS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
                   5: (1 << 16) - 1}
_FILE_RIGHTS = _FS["execute"] | _FS["write_file"] | _FS["read_file"] | _FS["truncate"] | _FS["ioctl_dev"]
_READ = _FS["execute"] | _FS["read_file"] | _FS["read_dir"]
# Writable folders get no execute (nothing written there is ever run) and no device nodes.
_WRITE = (_FS["read_file"] | _FS["read_dir"] | _FS["write_file"] | _FS["remove_dir"]
          | _FS["remove_file"] | _FS["make_dir"] | _FS["make_reg"] | _FS["make_sock"]
          | _FS["make_fifo"] | _FS["make_sym"] | _FS["refer"] | _FS["truncate"])
_DEVICE = _WRITE | _FS["ioctl_dev"]
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_TCP_ABI, _SCOPE_ABI = 4, 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def landlock_abi() -> int:
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        # ENOSYS: not built in; EOPNOTSUPP: not enabled at boot; EPERM: a seccomp filter (containers).
        return 0


def unavailable_reason() -> str | None:
    abi = landlock_abi()
    if abi >= _TCP_ABI:
        return None
    if abi == 0:
        return ("this kernel has no Landlock (it needs Linux >= 6.7 with CONFIG_SECURITY_LANDLOCK=y and "
                "'landlock' in the lsm= boot parameter); run workers unconfined with --no-sandbox")
    return (f"this kernel's Landlock ABI is {abi}; confining workers' TCP needs ABI >= {_TCP_ABI} "
            "(Linux >= 6.7); upgrade the kernel or run workers unconfined with --no-sandbox")


# -- applying -------------------------------------------------------------------------------
def apply(confinement: Confinement) -> list[str]:
    """Confine the calling process for good; returns notes on what could not be done as asked."""
    notes = []
    if confinement.earlier_threads and len(threads := _thread_names()) > 1:
        abi = _abi()
        others = [t for t in threads if t.split(" ")[0] != str(threading.get_native_id())]
        notes.append(f"{len(others)} threads started before the confinement (by the profiler's library) are "
                     f"not confined: {', '.join(others)}")
    else:
        abi = _single_threaded_abi()
    _set_limits(confinement)
    in_new_network = False
    if confinement.new_network:
        in_new_network, note = _enter_new_network()
        if note:
            notes.append(note)
    if confinement.deny_tcp and abi < _TCP_ABI:
        if not in_new_network:
            raise ConfinementError(unavailable_reason() + "; and no new network namespace could be made")
        notes.append(f"TCP is not handled by Landlock ABI {abi}; the new network namespace blocks it")
    _restrict(confinement, abi)
    return notes


def narrow(confinement: Confinement) -> None:
    """Add a Landlock layer to an already confined process: from now on it reaches only what both
    layers grant (rulesets stack and can only narrow). Limits and network are left as they are."""
    _restrict(confinement, _single_threaded_abi())


def limit_address_space(limit_bytes: int) -> None:
    """RLIMIT_AS, soft and hard, so that the limit cannot be raised again (by this process or its code)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    value = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (value, value))


def _abi() -> int:
    abi = landlock_abi()
    if abi == 0:
        raise ConfinementError(unavailable_reason())
    return abi


def _single_threaded_abi() -> int:
    abi = _abi()
    threads = _thread_names()
    if len(threads) != 1:
        raise ConfinementError(f"confinement must be applied before a second thread starts (Landlock "
                               f"restricts only the calling thread); {len(threads)} threads are running: "
                               f"{', '.join(threads)}")
    return abi


def _thread_names() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(f"{tid} ({Path(f'/proc/self/task/{tid}/comm').read_text().strip()})")
        except OSError:
            names.append(tid)
    return names


def _set_limits(confinement: Confinement) -> None:
    for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, confinement.file_size_bytes),
                         (resource.RLIMIT_NOFILE, confinement.open_files)):
        _, hard = resource.getrlimit(limit)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        # The hard limit too: the confined code must not raise it back.
        resource.setrlimit(limit, (value, value))


def _enter_new_network() -> tuple[bool, str | None]:
    """A network namespace with only a down loopback; as root directly, else inside a user namespace."""
    if _libc.unshare(_CLONE_NEWNET) == 0:
        return True, None
    direct = os.strerror(ctypes.get_errno())
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        user = os.strerror(ctypes.get_errno())
        return False, (f"network namespace not permitted: unshare(CLONE_NEWNET): {direct}; with a user "
                       f"namespace: {user}; the worker shares the host's network (Landlock still denies TCP)")
    try:
        # Keep the same identity inside, so file ownership and getuid() look as before.
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
        Path("/proc/self/setgroups").write_text("deny\n")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
    except OSError as exc:
        return True, f"in a new user and network namespace, but the identity map failed: {exc}"
    return True, None


def _restrict(confinement: Confinement, abi: int) -> None:
    handled_fs = _FS_BITS_BY_ABI[min(abi, 5)]
    attr = _RulesetAttr(handled_fs, 0, 0)
    if confinement.deny_tcp and abi >= _TCP_ABI:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP   # and no port rule: none allowed
    if abi >= _SCOPE_ABI and confinement.scope_ipc:
        # No signals to, and no abstract-socket connections with, processes outside the sandbox.
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    size = 8 if abi < _TCP_ABI else 16 if abi < _SCOPE_ABI else 24
    try:
        ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    except OSError as exc:
        raise ConfinementError(f"landlock_create_ruleset failed: {exc}") from None
    try:
        for paths, rights in ((confinement.read_only, _READ), (confinement.read_write, _WRITE),
                              (confinement.devices, _DEVICE)):
            for path in paths:
                _allow(ruleset, path, rights & handled_fs)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        try:
            _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        except OSError as exc:
            raise ConfinementError(f"landlock_restrict_self failed: {exc}") from None
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: str, rights: int) -> None:
    """One path-beneath rule; a path that does not exist is skipped (it cannot be reached either)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfinementError(f"cannot open {path} for a Landlock rule: {exc}") from None
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS   # the kernel refuses folder rights on a file
        rule = _PathBeneathAttr(rights, fd)
        _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                 ctypes.byref(rule), ctypes.c_uint32(0))
    except OSError as exc:
        raise ConfinementError(f"landlock_add_rule for {path} failed: {exc}") from None
    finally:
        os.close(fd)
