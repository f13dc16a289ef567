"""`kernel-referee demo` on a CPU: its kernels compile well, the no-GPU path of the real command,
the table printer on hand-made answers, and the scripted agent against a real stdio server (with
the fake executor: real MCP, real NVRTC, verdicts from markers)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import StdioServerParameters

from harness.worker_side.nvrtc import compile_kernel
from harness.device import gpu_absent_reason
from server import demo
from server import demo_table
from server.demo_table import render_table

REPO = Path(__file__).resolve().parents[1]
no_gpu = pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU (tests/gpu/test_demo.py)")
REGISTERS_PER_SM = 65536


def threads(step: demo.Step) -> int:
    return math.prod(step.launch["block"])


@pytest.mark.parametrize("step", demo.PLAN, ids=[s.label for s in demo.PLAN])
def test_each_demo_kernel_compiles_as_its_header_says(step):
    result = compile_kernel(step.source, demo.KERNEL_NAME, options=step.options, arch="sm_90")
    assert step.source.startswith("// Demo candidate"), step.file
    if step.file == "broken.cu":
        assert not result.ok and 'no suitable conversion function from "float4" to "float"' in result.log
        return
    assert result.ok, result.log
    usage = result.resources
    assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0 and usage.stack_bytes == 0, usage
    assert "warning" not in result.full_log.lower(), result.full_log
    # at least two blocks per SM fit in the register file (the 128x128 kernel is tuned for exactly that)
    assert 0 < usage.registers and 2 * usage.registers * threads(step) <= REGISTERS_PER_SM, usage
    assert usage.shared_bytes <= 48 * 1024


def test_the_register_blocked_launches_match_their_tiles():
    for step in demo.PLAN:
        if step.file not in ("register_blocked.cu", "edge_bug.cu"):
            continue
        defines = dict(option[2:].split("=") for option in step.options)
        bm, bn = int(defines.get("BM", 128)), int(defines.get("BN", 128))
        assert step.launch == {"grid": [f"ceil_div(n, {bn})", f"ceil_div(m, {bm})"], "block": [bm * bn // 64]}


@no_gpu
def test_demo_without_a_gpu_compiles_every_candidate_and_says_why(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "server.cli", "demo", "--results", str(results)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for number, step in enumerate(demo.PLAN, 1):
        line = next(li for li in lines if li.startswith(f"[{number}/7] {step.label} ({step.file}"))
        expected = "compile FAILED" if step.file == "broken.cu" else "registers, 0 spill bytes"
        assert expected in line, line
    assert "-DBM=64 -DBN=64): compiled in" in done.stdout
    assert "error: no suitable conversion function" in done.stdout
    assert "No GPU: no NVIDIA driver library" in done.stdout
    assert "Running, checking and timing them (and serving the run) need an NVIDIA GPU" in done.stdout
    assert not results.exists()  # nothing ran, so no run folder


def test_demo_refuses_a_task_its_matmul_candidates_cannot_play(tmp_path):
    saxpy = REPO / "tests" / "fixtures" / "tasks" / "saxpy"
    done = subprocess.run([sys.executable, "-m", "server.cli", "demo", "--task", str(saxpy), "--results",
                           str(tmp_path / "results")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the demo's candidates are matmul_f32 kernels" in done.stderr and "saxpy" in done.stderr, done.stderr
    missing = subprocess.run([sys.executable, "-m", "server.cli", "demo", "--task", str(tmp_path / "nowhere")],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "is not a task folder" in missing.stderr, missing.stderr
    assert not (tmp_path / "results").exists()


# ------------------------------------------------------------------------------- the table

def stats(median_ms: float) -> dict:
    return {"median_ms": median_ms, "ci_low_ms": median_ms * 0.99, "ci_high_ms": median_ms * 1.01}


def speedup(ratio: float, beyond_noise: bool = True) -> dict:
    return {"ratio": ratio, "low": ratio * 0.98, "high": ratio * 1.02, "beyond_noise": beyond_noise}


def answer(attempt: int, verdict: str, medians: dict | None = None, ratio: float | None = None,
           reasons=()) -> dict:
    return {"attempt": attempt, "verdict": verdict, "reasons": list(reasons),
            "cases": [{"case": c, "stats": stats(ms)} for c, ms in (medians or {}).items()],
            "score_ms": math.prod((medians or {1: 1}).values()) ** 0.5,
            "speedup_vs_baseline": None if ratio is None else speedup(ratio), "speedup_vs_best": None}


DESCRIPTION = {"cases": [
    {"name": "odd-31x37x29", "role": "correctness", "baseline_median_ms": None},
    {"name": "square-2048", "role": "performance", "baseline_median_ms": 4.0},
    {"name": "rect-2000x1500x1000", "role": "performance", "baseline_median_ms": 1.0}], "best_attempt": 0}
ATTEMPTS = [
    ("register-blocked", answer(1, "valid-faster", {"square-2048": 1.0, "rect-2000x1500x1000": 0.25}, 4.0)),
    ("edge bug", answer(2, "rejected", reasons=[{"code": "mismatch", "case": "odd-31x37x29", "detail": "..."}])),
    ("broken", answer(3, "rejected", reasons=[{"code": "compile_error", "case": None, "detail": "error: ..."}])),
]
SUMMARY = {"best_attempt": 1, "speedup_vs_baseline": speedup(4.0), "status": "finished",
           "stop_reason": "budget exhausted", "holdout": {"attempt": 1, "passed": True, "cases": ["holdout-97x83x61"]}}


def rows(table: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in table.splitlines()[2:] if line[:1].isdigit() or line[:1] == "-"}


def test_the_table_shows_each_attempt_against_the_baseline_and_cublas():
    cublas = {"name": "cuBLAS", "cases": {"square-2048": 0.5, "rect-2000x1500x1000": 0.2}}
    description = dict(DESCRIPTION, vendor=cublas)
    table = render_table(description, ATTEMPTS, SUMMARY)
    header = table.splitlines()[0].split()
    assert header[:4] == ["#", "kernel", "verdict", "reasons"] and "square-2048" in header
    assert "odd-31x37x29" not in table.splitlines()[0]  # correctness cases are not timed
    by_attempt = rows(table)
    # vs cuBLAS: the geometric mean of cuBLAS's median over the row's, sqrt(0.5 / 4 * 0.2 / 1) for the baseline
    assert by_attempt["0"][3:] == ["baseline", "-", "4.000", "1.000", "1.00x", "0.16x"]
    assert by_attempt["1*"][-9:] == ["1.000", "0.250", "4.00x", "[3.92,", "4.08]", "faster", "beyond", "noise", "0.63x"]
    assert by_attempt["2"][3:] == ["rejected", "mismatch", "[odd-31x37x29]", "-", "-", "-", "-"]
    assert by_attempt["3"][2:] == ["rejected", "compile_error", "-", "-", "-", "-"]
    assert by_attempt["-"][1:] == ["cuBLAS", "(yardstick)", "-", "0.500", "0.200", "6.32x", "1.00x"]
    assert "best: attempt 1, vs the baseline 4.00x [3.92, 4.08] faster beyond noise" in table
    assert "holdout (hidden cases holdout-97x83x61): attempt 1 passed" in table
    assert "status: finished (budget exhausted)" in table


def test_the_table_says_slower_beyond_noise_where_the_whole_interval_is_below_one():
    slower = {"ratio": 0.74, "low": 0.74, "high": 0.74, "beyond_noise": False}
    level = {"ratio": 1.001, "low": 0.99, "high": 1.01, "beyond_noise": False}
    attempts = [("naive", dict(answer(1, "valid-not-faster", {"square-2048": 5.4, "rect-2000x1500x1000": 1.35}),
                               speedup_vs_baseline=slower)),
                ("same", dict(answer(2, "valid-not-faster", {"square-2048": 4.0, "rect-2000x1500x1000": 1.0}),
                              speedup_vs_baseline=level))]
    by_attempt = rows(render_table(DESCRIPTION, attempts, None))
    assert by_attempt["1"][-7:] == ["0.74x", "[0.74,", "0.74]", "slower", "beyond", "noise", "-"]
    assert " ".join(by_attempt["2"][-5:-1]) == "[0.99, 1.01] within noise"
    assert demo_table.attempt_line(attempts[0][1]).endswith("vs baseline 0.74x [0.74, 0.74] slower beyond noise; "
                                                            "vs the best before it -")


def test_without_a_vendor_timing_cublas_is_a_dash():
    table = render_table(DESCRIPTION, ATTEMPTS, SUMMARY)
    by_attempt = rows(table)
    assert by_attempt["0"][-1] == "-" and by_attempt["1*"][-1] == "-"
    assert "-" not in by_attempt and "no cuBLAS timing in describe_task (-)" in table  # no cuBLAS row


# ------------------------------------------------------------------- the scripted agent

@dataclasses.dataclass(frozen=True)
class MarkedStep(demo.Step):
    """A demo step whose source carries a fake executor's marker (tests/fake_executor.py)."""

    marker: str = ""

    @property
    def source(self) -> str:
        return super().source + f"\n// fake: {self.marker}\n"


# The fake executor runs nothing: it judges by markers in the source. The real referee rejects edge_bug.cu
# for a mismatch on odd-31x37x29 (tests/gpu/test_demo.py checks that on a GPU); here its step carries the
# marker that makes the fake say the same, so this test claims of each kernel what the real referee says.
FAKE_AGREES = tuple(MarkedStep(**vars(step), marker="wrong") if step.file == "edge_bug.cu" else step
                    for step in demo.PLAN)
EDGE_BUG, BROKEN = 3, 4


def test_the_scripted_agent_spends_the_budget_over_stdio(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=[str(REPO / "tests" / "fake_server.py"),
                                                                 str(tmp_path)])
    lines: list[str] = []
    played = anyio.run(demo.session, params, FAKE_AGREES, lines.append)
    attempts = [o.attempt for o in played.outcomes]
    assert [a["attempt"] for a in attempts] == list(range(1, 8))
    broken = played.outcomes[BROKEN]
    assert broken.validated is None and broken.timed is None
    assert attempts[BROKEN]["verdict"] == "rejected" and attempts[BROKEN]["reasons"][0]["code"] == "compile_error"
    edge = played.outcomes[EDGE_BUG]
    assert edge.step.file == "edge_bug.cu" and not edge.validated["passed"] and edge.timed is None
    assert attempts[EDGE_BUG]["verdict"] == "rejected" and attempts[EDGE_BUG]["reasons"][0]["code"] == "mismatch"
    assert all(a["verdict"].startswith("valid") for i, a in enumerate(attempts) if i not in (EDGE_BUG, BROKEN))
    assert all(o.validated["passed"] and o.timed for i, o in enumerate(played.outcomes)
               if i not in (EDGE_BUG, BROKEN))
    assert played.summary["status"] == "finished" and played.summary["stop_reason"] == "budget exhausted"
    assert any(line.startswith("[3/7] register-blocked 128x128: record_attempt: attempt 3 valid") for line in lines)
    assert any("... checking fresh inputs from secret seeds" in line for line in lines)  # progress reached us
    table = render_table(played.description, [(o.step.label, o.attempt) for o in played.outcomes], played.summary)
    assert len([line for line in table.splitlines() if line[:1].isdigit()]) == 8  # the baseline and seven attempts
    history = (tmp_path / played.summary["run"] / "history.json").read_text()
    assert "kernel-referee demo (scripted)" in history  # the usage each attempt declared
