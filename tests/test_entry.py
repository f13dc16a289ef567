"""The script's door: Ctrl-C while the modules import says one line; serve and demo start the GPU probe first."""

from __future__ import annotations

import builtins
import sys
import threading

import pytest

from server import entry
from server.cli import OTHER_COMMANDS
from server.cli_args import EXIT_INTERRUPTED


def test_an_interrupt_during_the_imports_says_one_line(monkeypatch, capsys):
    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "server.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "server.cli", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert entry.main() == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "kernel-referee: interrupted\n"


def test_the_script_runs_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel-referee", "--help"])
    try:
        entry.main()
    except SystemExit as exit_:
        assert exit_.code == 0
    assert "usage: kernel-referee" in capsys.readouterr().out


def test_serve_starts_the_gpu_probe_before_its_modules_import(monkeypatch):
    from harness import device
    real_import, seen = builtins.__import__, []

    def interrupted(name, *args, **kwargs):
        if name == "server.cli":
            seen.append(device._started)
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(device, "_started", None)
    monkeypatch.setattr(device, "_probe", lambda: "the probe")
    monkeypatch.delitem(sys.modules, "server.cli", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    monkeypatch.setattr(sys, "argv", ["kernel-referee", "serve", "--task", "cases/matmul_f32"])
    assert entry.main() == EXIT_INTERRUPTED
    assert seen == ["the probe"]


def test_the_started_probe_is_the_one_answered_and_is_taken_once(monkeypatch):
    import subprocess

    from harness import device
    answer = 'import json; print(json.dumps({"absent": "a reason from the started probe"}))'
    began = []

    def probe():
        began.append(1)
        return subprocess.Popen([sys.executable, "-c", answer], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    nvml = threading.Event()
    monkeypatch.setattr(device, "_started", None)
    monkeypatch.setattr(device, "_probe", probe)
    monkeypatch.setattr(device, "_start_nvml", nvml.set)
    device.start_probe()
    device.start_probe()  # a second start keeps the first probe
    assert nvml.wait(10)  # NVML's start began beside it
    device.gpu_absent_reason.cache_clear()
    try:
        assert device.gpu_absent_reason() == "a reason from the started probe"
        assert began == [1] and device._started is None
    finally:
        device.gpu_absent_reason.cache_clear()


def test_a_probe_that_prints_nothing_is_reported_with_its_stderr(monkeypatch):
    import subprocess

    from harness import device
    monkeypatch.setattr(device, "_started", None)
    monkeypatch.setattr(device, "_probe", lambda: subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.exit('driver exploded')"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
    device.gpu_absent_reason.cache_clear()
    try:
        assert device.gpu_absent_reason() == "the GPU probe failed: driver exploded"
    finally:
        device.gpu_absent_reason.cache_clear()


def test_help_names_every_command_the_door_hands_on_and_each_answers_its_own_help(monkeypatch, capsys):
    assert set(OTHER_COMMANDS) == set(entry.GUARD_COMMANDS) | set(entry.SERVICE_COMMANDS)
    monkeypatch.setattr(sys, "argv", ["kernel-referee", "--help"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 0
    listing = capsys.readouterr().out.split("more commands, each with its own --help:")[1]
    assert [line.split()[0] for line in listing.strip().splitlines()] == list(OTHER_COMMANDS)
    for name in OTHER_COMMANDS:
        monkeypatch.setattr(sys, "argv", ["kernel-referee", name, "--help"])
        with pytest.raises(SystemExit) as stopped:
            entry.main()
        assert stopped.value.code == 0
        assert f"usage: kernel-referee {name}" in capsys.readouterr().out
