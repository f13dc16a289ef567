"""The timing noise of the recorded GPU runs, as a generator of guard rounds (bench/guard.py).

Sources, all under bench/recorded/:
- `h200-*/timing.json` (seven H200 recordings): per kernel, every independent run's median, the run's
  noise (the 95% interval half-width of its median, relative) after its number of launches, and the CV
  of the medians across runs;
- `h100-2026-12-05-readme-suite/timing.log`: the same kernels' CV over runs on an H100 (its table);
- the seven timing.json's `discrimination`: 20 A/A trials of an interleaved ratio, the check that the model
  is not quieter than a real interleaved ratio.

These recordings keep no per-launch samples, so a kernel's launches are rebuilt from those numbers, taking
for each kernel the worst of every recording (bench/guard_samples.py draws them from an H100 job's recorded
launches instead):
- a launch's spread within a job: noise * sqrt(launches) / (1.96 * 1.2533) (a median's standard error is
  1.2533 sigma / sqrt(n)), with Student-t (3 degrees of freedom) tails, and 1% of launches 10-100% slow
  (a preempted or interrupted launch);
- a job's shift: the CV of the medians across runs, drawn independently for the kernel and its baseline
  in each round. Interleaving cancels whatever the two share (clocks, heat); taking none of that as shared
  is the pessimistic reading.
- 2% of rounds are disturbed without a sign (one of the two kernels 2-10% slow, nothing in NVML), and 5%
  with one (another process or a thermal throttle in the readings, one kernel 5-30% slow).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from guard.verdict import TimingRound
from harness.nvml import GpuState, GpuWatch

RECORDED = Path(__file__).resolve().parent / "recorded"
H100_TABLE = RECORDED / "h100-2026-12-05-readme-suite" / "timing.log"
MEDIAN_SE = 1.2533  # a median's standard error over the mean's, for a normal body
LAUNCHES = 100  # per kernel per round: the referee's timing iterations
SLOW_LAUNCH_SHARE = 0.01
QUIET_DISTURBANCE_SHARE = 0.02
FLAGGED_DISTURBANCE_SHARE = 0.05
CLOCK_MHZ = 1980


class NoiseProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    median_ms: float
    launch_sd: float  # relative, within a job
    job_sd: float  # relative, between jobs
    sources: list[str]
    # Recorded launches as ratios to their job's median (bench/guard_samples.py): drawn from, when present,
    # instead of the Student-t body and its slow launches.
    launch_ratios: list[float] | None = None
    # Draw a round's launches as one run of consecutive recorded launches, in their order, instead of with
    # replacement: a slow stretch of the job then lands whole in a round, as it would on the GPU.
    consecutive: bool = False
    job_sd_from: str | None = None  # the model's kernel whose shift between jobs this one takes


def _launch_sd(noise: float, launches: int) -> float:
    return noise * math.sqrt(launches) / (1.96 * MEDIAN_SE)


def _h100_cvs() -> dict[str, float]:
    """The H100 table's 'CV over runs' column, by kernel label."""
    cvs = {}
    for line in H100_TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"[0-9.]+%", cells[2]):
            cvs[cells[0]] = float(cells[2].rstrip("%")) / 100.0
    return cvs


def load_profiles(recorded: Path = RECORDED) -> list[NoiseProfile]:
    """One profile per kernel label: the worst launch spread and job shift of every recording."""
    seen: dict[str, dict] = {}
    for path in sorted(recorded.glob("h200-*/timing.json")):
        for kernel in json.loads(path.read_text())["kernels"]:
            entry = seen.setdefault(kernel["label"], {"median_ms": [], "launch_sd": [], "job_sd": [], "sources": []})
            entry["median_ms"].append(kernel["median_ms"])
            entry["launch_sd"].extend(_launch_sd(r["noise"], r["launches"]) for r in kernel["runs"])
            entry["job_sd"].append(kernel["cv"])
            entry["sources"].append(path.parent.name)
    for label, cv in _h100_cvs().items():
        if label in seen:
            seen[label]["job_sd"].append(cv)
            seen[label]["sources"].append(H100_TABLE.parent.name)
    return [NoiseProfile(label=label, median_ms=float(np.median(e["median_ms"])), launch_sd=max(e["launch_sd"]),
                         job_sd=max(e["job_sd"]), sources=sorted(set(e["sources"])))
            for label, e in seen.items()]


def recorded_aa_sd(recorded: Path = RECORDED) -> list[float]:
    """The standard deviation of the recorded A/A interleaved ratios, one per recording with 20 trials."""
    found = []
    for path in sorted(recorded.glob("h200-*/timing.json")):
        trials = json.loads(path.read_text()).get("discrimination", {}).get("trials_aa", [])
        if len(trials) >= 10:
            found.append(float(np.std([t[0] for t in trials], ddof=1)))
    return found


def _watch(rng: np.random.Generator) -> GpuWatch:
    calm = GpuState(sm_clock_mhz=CLOCK_MHZ, max_sm_clock_mhz=CLOCK_MHZ, processes=[100])
    if rng.random() < 0.5:
        return GpuWatch(before=calm, after=calm.model_copy(update={"processes": [100, 4242]}), other_processes=[4242])
    hot = calm.model_copy(update={"sm_clock_mhz": 1600, "throttle": ["sw_thermal_slowdown"]})
    return GpuWatch(before=calm, after=hot)


def launches(rng: np.random.Generator, profile: NoiseProfile, median_ms: float) -> np.ndarray:
    if profile.launch_ratios is not None:
        recorded = np.asarray(profile.launch_ratios)
        if profile.consecutive:
            start = int(rng.integers(0, len(recorded) - LAUNCHES + 1))
            body = recorded[start:start + LAUNCHES]
        else:
            body = rng.choice(recorded, LAUNCHES, replace=True)
        return median_ms * rng.normal(1.0, profile.job_sd) * body
    # Student-t with 3 degrees of freedom has variance 3: scaled to the profile's spread.
    body = 1.0 + profile.launch_sd * rng.standard_t(3, LAUNCHES) / math.sqrt(3.0)
    slow = rng.random(LAUNCHES) < SLOW_LAUNCH_SHARE
    body[slow] *= rng.uniform(1.1, 2.0, int(slow.sum()))
    return median_ms * rng.normal(1.0, profile.job_sd) * np.maximum(body, 0.05)


class RoundMaker:
    """Rounds of a kernel `slower` times its accepted self, against a baseline twice as slow."""

    def __init__(self, profile: NoiseProfile, slower: float, rng: np.random.Generator):
        self.profile, self.slower, self.rng = profile, slower, rng
        self.made: list[TimingRound] = []

    def __call__(self) -> TimingRound:
        self.made.append(self._draw())
        return self.made[-1]

    def _draw(self) -> TimingRound:
        rng, profile = self.rng, self.profile
        kernel = launches(rng, profile, profile.median_ms * self.slower)
        baseline = launches(rng, profile, profile.median_ms * 2.0)
        watch = GpuWatch(before=GpuState(sm_clock_mhz=CLOCK_MHZ, max_sm_clock_mhz=CLOCK_MHZ),
                         after=GpuState(sm_clock_mhz=CLOCK_MHZ, max_sm_clock_mhz=CLOCK_MHZ))
        draw = rng.random()
        if draw < QUIET_DISTURBANCE_SHARE + FLAGGED_DISTURBANCE_SHARE:
            hit = kernel if rng.random() < 0.5 else baseline
            flagged = draw >= QUIET_DISTURBANCE_SHARE
            hit *= rng.uniform(1.05, 1.30) if flagged else rng.uniform(1.02, 1.10)
            if flagged:
                watch = _watch(rng)
        return TimingRound(candidate_ms=kernel.tolist(), baseline_ms=baseline.tolist(), watch=watch)


def model_round_ratio_sd(profile: NoiseProfile, rng: np.random.Generator, rounds: int = 400) -> float:
    """The model's spread of one undisturbed round's ratio of medians (relative): to hold beside the
    recorded A/A ratios, which no model quieter than the GPU may undercut."""
    logs = [math.log(np.median(launches(rng, profile, 1.0)) / np.median(launches(rng, profile, 2.0)))
            for _ in range(rounds)]
    return float(np.std(logs, ddof=1))
