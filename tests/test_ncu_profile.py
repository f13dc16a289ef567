"""harness/ncu_profile.py's CPU parts: the ncu command around the GPU worker, and ncu's one-line reasons."""

from pathlib import Path

import pytest

from harness import ncu_profile
from harness.gpu_workers import GPU_WORKER_COMMAND
from harness.ncu_profile import NCU_MISSING, NO_PERMISSION, ProfilingUnavailable, ncu_command, profile_once
from sandbox.grants import gpu_worker_confinement, profiled_gpu_worker_confinement


def test_the_command_profiles_one_launch_of_the_exact_symbol_into_a_log_file_around_the_worker():
    command = ncu_command("/opt/ncu", "_Z3fooPf", ("a.sum", "b.pct"), Path("/tmp/x/ncu.csv"))
    assert command[0] == "/opt/ncu" and tuple(command[-len(GPU_WORKER_COMMAND):]) == GPU_WORKER_COMMAND
    flags = command[1:-len(GPU_WORKER_COMMAND)]
    pairs = {flags[i]: flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag.startswith("--")
             and not flags[i + 1].startswith("--")}
    assert pairs["--metrics"] == "a.sum,b.pct" and pairs["--launch-count"] == "1"
    assert pairs["--kernel-name"] == "_Z3fooPf" and pairs["--kernel-name-base"] == "mangled"
    assert pairs["--page"] == "raw" and pairs["--log-file"] == "/tmp/x/ncu.csv" and "--csv" in flags


def test_without_ncu_on_the_path_profiling_is_unavailable_in_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ProfilingUnavailable, match=r"^Nsight Compute \(ncu\) is not on this machine's PATH$"):
        profile_once("matmul_f32", ("gpu__time_duration.sum",), lambda worker: None)
    assert "\n" not in NCU_MISSING


def test_ncus_reasons_are_one_line_the_permission_error_named():
    assert ncu_profile._why("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"
                            "\n") == NO_PERMISSION
    assert ncu_profile._why("==ERROR== Failed to find metric foo\n==ERROR== second\n") == "ncu: Failed to find metric foo"
    assert ncu_profile._why("==PROF== Disconnected\n") is None


def test_the_profiled_worker_keeps_the_file_rules_and_opens_only_network_and_ipc(tmp_path):
    plain, profiled = gpu_worker_confinement(tmp_path), profiled_gpu_worker_confinement(tmp_path)
    assert (profiled.read_only, profiled.read_write, profiled.devices) == (plain.read_only, plain.read_write,
                                                                          plain.devices)
    assert (plain.new_network, plain.deny_tcp, plain.scope_ipc) == (True, True, True)
    assert (profiled.new_network, profiled.deny_tcp, profiled.scope_ipc) == (False, False, False)
