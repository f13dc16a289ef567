"""The H100's recorded launches as the guard bench's launch noise (`bench/guard.py --launches h100-samples`).

`h100-2026-12-06-gpu-run/spreads.json` keeps every launch of one job per kernel and case (30 rows, 100 to
400 launches each). A round's launches are drawn from that job's own samples, with replacement, as ratios to
the job's median: the real shape of a launch's spread is kept (its skew, its two modes where it has two, its
outliers), where the model (bench/guard_noise.py) draws Student-t tails and 1% slow launches instead. The
synthetic slow launches are left out here: the samples carry whatever outliers the GPU gave.

One job holds no shift between jobs, so that still comes from the model: the worst CV of the medians across
runs over every recording (seven H200 ones and the H100 README suite's 'CV over runs'). A kernel-case the
model knows by another name takes that profile's; one it does not know (the references, the demo's kernels)
takes the CV of the model's kernel nearest in median latency, which falls with latency.

Drawn with replacement, the launches lose their order: a job's slow stretch is spread over every round.
`--launches h100-consecutive` keeps it, drawing a round as a run of consecutive launches of the jobs that
recorded at least twice a round's launches (two of the 30).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bench.guard_noise import LAUNCHES, RECORDED, NoiseProfile, load_profiles

H100_SAMPLES = RECORDED / "h100-2026-12-06-gpu-run" / "spreads.json"
# spreads.json's kernel and case -> the model's label for the same kernel on the same sizes.
MODEL_LABELS = {
    ("layernorm_f32 initial", "square-4096"): "layernorm 4096x4096",
    ("layernorm_f32 initial", "bert-32768x768"): "layernorm 32768x768",
    ("matmul_bf16 initial", "square-2048"): "matmul_bf16 2048^3",
    ("matmul_bf16 reference", "square-2048"): "matmul_bf16 ref 2048^3",
    ("matmul_f32 initial", "square-2048"): "matmul_f32 2048^3",
    ("matmul_f32 initial", "rect-2000x1500x1000"): "matmul_f32 2000x1500x1000",
    ("matmul_f32 reference", "square-2048"): "matmul_f32 ref 2048^3",
    ("softmax_f32 initial", "square-4096"): "softmax 4096x4096",
    ("transpose_f32 initial", "tall-4096x2048"): "transpose 4096x2048",
}


def _job_profile(kernel: str, case: str, median_ms: float, model: list[NoiseProfile]) -> NoiseProfile:
    """The model's profile whose shift between jobs this kernel-case takes: its own, else the nearest in latency."""
    label = MODEL_LABELS.get((kernel, case))
    if label is not None:
        return next(p for p in model if p.label == label)
    return min(model, key=lambda p: abs(math.log(p.median_ms / median_ms)))


def load_sample_profiles(samples: Path = H100_SAMPLES, recorded: Path = RECORDED) -> list[NoiseProfile]:
    """One profile per recorded kernel-case, its launches the recorded ones as ratios to their median."""
    model = load_profiles(recorded)
    profiles = []
    for row in json.loads(samples.read_text())["rows"]:
        launches_ms = np.asarray(row["samples_ms"], dtype=float)
        median_ms = float(np.median(launches_ms))
        ratios = launches_ms / median_ms
        job = _job_profile(row["kernel"], row["case"], median_ms, model)
        profiles.append(NoiseProfile(
            label=f"{row['kernel']} {row['case']}", median_ms=median_ms, launch_sd=float(np.std(ratios, ddof=1)),
            job_sd=job.job_sd, launch_ratios=ratios.tolist(), job_sd_from=job.label,
            sources=[samples.parent.name, *job.sources]))
    return profiles


def load_consecutive_profiles(samples: Path = H100_SAMPLES, recorded: Path = RECORDED) -> list[NoiseProfile]:
    """The kernel-cases with at least two rounds' worth of launches, drawn as runs of consecutive launches
    (with fewer, every run would be the whole job and its median would never move)."""
    return [p.model_copy(update={"consecutive": True}) for p in load_sample_profiles(samples, recorded)
            if len(p.launch_ratios) >= 2 * LAUNCHES]
