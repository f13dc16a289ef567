"""The suite's own disk: a passing test's tmp_path goes as the test ends.

Run folders made by the tests hold expected outputs (about 110 MiB each for matmul_f32); kept for the whole
session they came to about 35 GB, more than a CI machine's disk may have free, and later tests then failed on
the referee's own disk check.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = '''
import pathlib


def test_passes(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 1000)
    pathlib.Path({seen!r}).write_text(str(tmp_path) + "\\n", encoding="utf-8")


def test_fails(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 1000)
    with open({seen!r}, "a", encoding="utf-8") as seen:
        seen.write(str(tmp_path) + "\\n")
    assert False
'''


def test_a_passing_tests_folder_goes_and_a_failing_ones_stays(tmp_path):
    seen = tmp_path / "seen.txt"
    (tmp_path / "test_probe.py").write_text(PROBE.format(seen=str(seen)), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"), str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    passed, failed = (Path(line) for line in seen.read_text(encoding="utf-8").split())
    assert not passed.exists()  # the project's setting: a passing test's folder is removed as it ends
    assert (failed / "big").exists()  # a failing one is kept to be read
