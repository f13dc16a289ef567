"""Ctrl-C while the command line's modules are still importing ends with one line, not a traceback."""

from __future__ import annotations

import builtins
import sys

from server import entry
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
