"""The GPU job (.ci/gpu): the tests it names exist and carry the gpu marker, its three thirds of tests/gpu cover
every file once, and a stage run here (no GPU) leaves its log and its summary line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / ".ci" / "gpu"


def _named_tests() -> list[str]:
    """The files the stages `new` and `products` name."""
    return [path for group in ("NEW_TESTS", "PRODUCT_TESTS")
            for path in re.search(group + r"=\((.*?)\)", JOB.read_text(), re.S).group(1).split()]


def test_every_test_the_job_names_exists_and_is_a_gpu_test():
    named = _named_tests()
    assert len(named) >= 10 and all((REPO / path).is_file() for path in named), named
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           *named], cwd=REPO, capture_output=True, text=True, timeout=300)
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert collected == set(named), set(named) - collected  # each file holds gpu-marked tests


def _third(which: int) -> list[str]:
    script = JOB.read_text()
    function = script[script.index("third() {"):script.index("\n}\n", script.index("third() {")) + 3]
    done = subprocess.run(["bash", "-c", f"{function}\nthird {which}"], cwd=REPO, capture_output=True, text=True,
                          check=True)
    return done.stdout.split()


def test_the_three_thirds_of_tests_gpu_cover_every_file_once():
    thirds = [_third(0), _third(1), _third(2)]
    every = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "gpu").glob("test_*.py"))
    assert sorted(sum(thirds, [])) == every and sum(len(t) for t in thirds) == len(set(sum(thirds, [])))
    assert max(map(len, thirds)) - min(map(len, thirds)) <= 1


def test_a_stage_writes_its_log_and_its_summary_line(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(JOB), "rest"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    line = (tmp_path / "summary.txt").read_text().strip()
    assert re.fullmatch(r"rest: \d+ (passed|skipped).* in [\d.]+s \(exit 0\)", line), line
    assert (tmp_path / "rest.log").is_file()
    refused = subprocess.run(["bash", str(JOB), "nonsense"], cwd=REPO, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown stage: nonsense" in refused.stderr


def test_a_stage_with_too_little_of_the_slot_left_is_not_started_and_says_so(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "SLOT_S": "20"}
    done = subprocess.run(["bash", str(JOB), "rest", "timing"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert [re.sub(r"\d+ s left", "N s left", line) for line in lines] == [
        "rest: not started: N s left of the slot", "timing: not started: N s left of the slot"]
    assert not (tmp_path / "rest.log").exists()


def test_a_stage_that_outruns_the_slot_is_interrupted_with_its_summary_line(tmp_path):
    script = JOB.read_text()
    functions = script[script.index("summary() {"):script.index("third() {")]
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\nimport pytest\npytestmark = pytest.mark.gpu\n\n\ndef test_quick():\n    pass\n\n\n"
                    "def test_slow():\n    time.sleep(120)\n")
    body = f"OUT={tmp_path}; PY={sys.executable}; ENDS_AT=$(( SECONDS + 40 ))\n{functions}\npytest_stage cut {slow}"
    done = subprocess.run(["bash", "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = (tmp_path / "summary.txt").read_text().strip()
    assert re.fullmatch(r"cut: 1 passed.* in [\d.]+s \(exit 124, cut at the slot's end\)", line), line


def test_the_files_stage_runs_the_files_it_is_given_and_refuses_none(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "FILES": "tests/gpu/test_check_unwritten.py tests/gpu/test_check_cli.py"}
    done = subprocess.run(["bash", str(JOB), "files"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "files.log").read_text()
    assert "tests/gpu/test_check_unwritten.py" in log and "tests/gpu/test_check_cli.py" in log
    assert "tests/gpu/test_guard.py" not in log
    assert re.fullmatch(r"files: \d+ skipped.* in [\d.]+s \(exit 0\)", (tmp_path / "summary.txt").read_text().strip())
    env.pop("FILES")
    refused = subprocess.run(["bash", str(JOB), "files"], cwd=REPO, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "FILES names no test file" in refused.stderr
