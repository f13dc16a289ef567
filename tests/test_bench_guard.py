"""bench/guard.py on a few runs: its noise is read from the recorded GPU runs and its report has every number."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.guard import guard_runs, main
from bench.guard_noise import RoundMaker, launches, load_profiles, recorded_aa_sd
from bench.guard_samples import H100_SAMPLES, load_consecutive_profiles, load_sample_profiles
from guard.verdict import DEFAULT_THRESHOLD, VerdictSettings, round_trouble


def test_the_noise_comes_from_every_recording():
    profiles = {p.label: p for p in load_profiles()}
    assert len(profiles) == 12
    tiny = profiles["transpose 512x512"]
    assert tiny.job_sd == pytest.approx(0.0294, abs=5e-4)  # the serial-tracing recording's CV, the worst
    assert "h100-2026-12-05-readme-suite" in tiny.sources and len(tiny.sources) == 8
    assert 0.05 < tiny.launch_sd < 0.2 and profiles["matmul_f32 2048^3"].launch_sd < 0.005
    assert len(recorded_aa_sd()) == 6 and max(recorded_aa_sd()) < 0.002


def test_rounds_carry_the_profiles_size_and_some_are_flagged():
    profile = next(p for p in load_profiles() if p.label == "layernorm 32768x768")
    maker = RoundMaker(profile, 1.0, np.random.default_rng(1))
    rounds = [maker() for _ in range(400)]
    ratio = np.median([np.median(r.candidate_ms) / np.median(r.baseline_ms) for r in rounds])
    assert ratio == pytest.approx(0.5, rel=0.01) and len(rounds[0].candidate_ms) == 100
    flagged = sum(round_trouble(r, 1980, 0.95) is not None for r in rounds)
    assert 5 <= flagged <= 40  # 5% of rounds


def test_the_report_has_every_number(tmp_path):
    out = tmp_path / "guard.json"
    assert main(["--unchanged", "2", "--slower-trials", "1", "--thresholds", "0.015", "--approval-rounds", "8",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())["by_threshold"]["0.015"]
    assert len(report["rows"]) == 12
    for key in ("false_alarms_per_1000", "unchanged_pass", "detected_2pct", "detected_3pct", "detected_5pct",
                "rounds_mean_unchanged"):
        assert key in report["all"] and key in report["from_10us"]
    assert report["from_10us"]["kernels"] == 10
    row = report["rows"][-1]
    assert row["unchanged"]["trials"] == 2 and sum(row["slower_5pct"]["verdicts"].values()) == 1


def test_the_default_rule_holds_its_targets_on_a_22_us_kernels_recorded_noise():
    # A fixed seed: the same draws every time, so this checks the rule, not luck.
    profile = next(p for p in load_profiles() if p.label == "transpose 4096x2048")
    rng, settings = np.random.default_rng(7), VerdictSettings()
    unchanged = guard_runs(profile, 1.0, 150, DEFAULT_THRESHOLD, settings, rng)
    slower = guard_runs(profile, 1.03, 60, DEFAULT_THRESHOLD, settings, rng)
    assert unchanged["verdicts"].get("regressed", 0) == 0 and unchanged["verdicts"]["pass"] >= 145
    assert slower["verdicts"].get("regressed", 0) >= 57 and slower["verdicts"].get("pass", 0) == 0


def _softmax_samples():
    # The recording's most uneven kernel-case: two modes, 400 launches.
    return next(p for p in load_sample_profiles() if p.label == "softmax_f32 initial square-4096")


def test_the_h100_samples_are_every_recorded_launch_with_the_models_shift_between_jobs():
    profiles = {p.label: p for p in load_sample_profiles()}
    rows = json.loads(H100_SAMPLES.read_text())["rows"]
    assert len(profiles) == len(rows) == 30
    row = next(r for r in rows if r["kernel"] == "softmax_f32 initial" and r["case"] == "square-4096")
    softmax = profiles["softmax_f32 initial square-4096"]
    assert softmax.median_ms == pytest.approx(float(np.median(row["samples_ms"])))
    assert np.allclose(np.multiply(softmax.launch_ratios, softmax.median_ms), row["samples_ms"])
    model = {p.label: p for p in load_profiles()}
    assert softmax.job_sd == model["softmax 4096x4096"].job_sd and softmax.job_sd_from == "softmax 4096x4096"
    # A kernel the model does not know takes the shift of the model's kernel nearest in latency.
    assert profiles["demo naive square-2048"].job_sd_from == "matmul_f32 ref 2048^3"


def test_h100_sample_launches_are_drawn_from_the_recording():
    still = _softmax_samples().model_copy(update={"job_sd": 0.0})
    recorded = np.asarray(still.launch_ratios)
    drawn = np.concatenate([launches(np.random.default_rng(seed), still, 1.0) for seed in range(200)])
    assert np.isin(drawn, recorded).all()  # every launch one the GPU gave, none made up
    quantiles = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
    assert np.quantile(drawn, quantiles) == pytest.approx(np.quantile(recorded, quantiles), abs=0.004)
    assert (drawn > 1.1).mean() == pytest.approx((recorded > 1.1).mean(), abs=0.01)  # the slow mode's share


def test_h100_sample_rounds_reproduce_from_a_seed_and_carry_the_jobs_shift():
    profile = _softmax_samples()
    def rounds(seed: int) -> list:
        maker = RoundMaker(profile, 1.0, np.random.default_rng(seed))
        return [maker() for _ in range(3)]

    assert rounds(5) == rounds(5) and rounds(5) != rounds(6)
    # Each draw of 100 launches is scaled by one job's shift: on a kernel whose launches barely move, the
    # medians spread as the job's shift does, and not without it.
    steady = next(p for p in load_sample_profiles() if p.label == "matmul_f32 initial square-2048")

    def medians_sd(profile) -> float:
        return float(np.std([np.median(launches(np.random.default_rng(s), profile, 1.0)) for s in range(400)]))

    assert medians_sd(steady) == pytest.approx(steady.job_sd, rel=0.2)
    assert medians_sd(steady.model_copy(update={"job_sd": 0.0})) < 0.25 * steady.job_sd


def test_consecutive_draws_are_runs_of_the_jobs_launches_in_their_order():
    profiles = load_consecutive_profiles()
    assert {p.label for p in profiles} == {"softmax_f32 initial square-4096", "layernorm_f32 initial square-4096"}
    softmax = next(p for p in profiles if p.label.startswith("softmax")).model_copy(update={"job_sd": 0.0})
    recorded = np.asarray(softmax.launch_ratios)
    starts = set()
    for seed in range(50):
        drawn = launches(np.random.default_rng(seed), softmax, 1.0)
        # Launch times repeat (the clock's grain): the run is found by matching all 100 of them.
        found = [i for i in range(len(recorded) - 99) if np.array_equal(drawn, recorded[i:i + 100])]
        assert found
        starts.add(found[0])
    assert len(starts) > 20  # anywhere in the job, not one fixed stretch
    # The job's slow first stretch lands whole in a round: its medians spread far more than resampled ones.
    resampled = softmax.model_copy(update={"consecutive": False})

    def medians_sd(profile) -> float:
        return float(np.std([np.median(launches(np.random.default_rng(s), profile, 1.0)) for s in range(300)]))

    assert medians_sd(softmax) > 3 * medians_sd(resampled)
