"""How often the guard's verdict rule raises a false alarm, and how often it catches a slowdown, on the CPU:
the guard's own decision code (guard/verdict.py `decide_with_repeats`) fed rounds drawn from the timing
noise of the recorded H100 and H200 runs (bench/guard_noise.py says which files and how).

    python bench/guard.py [--unchanged 1000] [--slower-trials 300] [--thresholds 0.01,0.015,0.02]
                          [--launches model|h100-samples|h100-consecutive] [--approval rounds|run] [--json OUT]

For every recorded kernel and threshold: `--unchanged` guard runs of an unchanged kernel (each against a
fresh approval, itself measured with the same noise as `kernel-referee approve` measures it: over
`--approval-rounds` interleaved rounds, 32 unless told, guard/accepted.py; or, with `--approval run`, as
`approve --from-run` takes it: the run's two timing jobs per kernel merged, its speedup interval) and
`--slower-trials` runs of a copy 2%, 3% and 5% slower. Prints false alarms per 1000 unchanged runs, the share
of each slowdown flagged regressed, the share left inconclusive, and the rounds used (mean and 95th percentile).
`--launches h100-samples` draws each round's launches from an H100 job's recorded launches instead of the
model's (bench/guard_samples.py), over the 30 kernel-cases that recording holds; `h100-consecutive` as runs of
consecutive launches, in their order, over the two that recorded enough of them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.guard_noise import (NoiseProfile, RoundMaker, load_profiles, model_round_ratio_sd,  # noqa: E402
                               recorded_aa_sd)
from bench.guard_samples import load_consecutive_profiles, load_sample_profiles  # noqa: E402
from guard import accepted  # noqa: E402
from guard.approval import CaseLatency  # noqa: E402
from guard.verdict import (CaseInput, Correctness, Verdict, VerdictSettings, decide,  # noqa: E402
                           decide_with_repeats, round_trouble)
from harness.stats import speedup, summarize  # noqa: E402
from server.run import RunSettings  # noqa: E402

SLOWDOWNS = (0.02, 0.03, 0.05)
# An approval's ratio measured as the guard measures, over 32 rounds (approve's default): an approval is made
# once, and its error would shift every later run (with 8 rounds, see the README's sensitivity rows).
APPROVAL_ROUNDS = accepted.DEFAULT_ROUNDS
# How an approval's ratio is taken: approve's interleaved rounds, or the run's own timing (approve --from-run).
APPROVALS = ("rounds", "run")
SIMPLER_RULES = ("point_rule_8_rounds", "strict_rule_8_rounds")
CORRECT = Correctness(correct=True)
PROFILES = {"model": load_profiles, "h100-samples": load_sample_profiles,
            "h100-consecutive": load_consecutive_profiles}


def approved_ratio(maker: RoundMaker, settings: VerdictSettings, approval_rounds: int,
                   approval: str = "rounds") -> dict:
    """The ratio an approval records, with its interval, as the guard's CaseInput takes it (guard/accepted.py):
    measured in interleaved rounds as approve does, or from the run's own timing as approve --from-run does."""
    if approval == "run":
        return run_approval(maker, RunSettings().timing_rounds)
    ratio = accepted.measure(lambda only: {"approval": maker()}, ["approval"], approval_rounds, settings)["approval"]
    return {"accepted_ratio": ratio.estimate, "accepted_low": ratio.low, "accepted_high": ratio.high,
            "accepted_confidence": ratio.confidence}


def run_approval(maker: RoundMaker, jobs: int) -> dict:
    """The accepted ratio of an approval taken from its run: `jobs` timing jobs of the kernel and of its baseline
    (the run's timing_rounds), each kernel's launches merged into one sample set, their medians' ratio with the
    speedup interval the run records (harness/stats.py), read as the guard reads an approval without rounds.
    Nothing is set aside: the run does not read NVML's readings."""
    rounds = [maker() for _ in range(jobs)]
    kernel = summarize([ms for r in rounds for ms in r.candidate_ms])
    baseline = summarize([ms for r in rounds for ms in r.baseline_ms])
    return accepted.accepted_fields(CaseLatency(case="approval", kernel=kernel, baseline=baseline,
                                                speedup=speedup(baseline, kernel)))


def simpler_rules(case: CaseInput, maker: RoundMaker, settings: VerdictSettings) -> dict[str, bool]:
    """What two simpler rules would have called on the same run's first 8 rounds, with no repeats: firecracker's
    A/B rule (slower beyond noise and by more than the threshold, as a point estimate) and a strict 'slower at
    all' rule (KernelBench's `speedup > 1.0`, turned around)."""
    # The first 8 rounds the guard kept: the simpler rules are spared the GPU's troubles too.
    kept = [r for r in maker.made if round_trouble(r, case.approval_sm_clock_mhz, settings.clock_floor) is None]
    change = decide(case, kept[:8], CORRECT, settings).change
    if change is None:
        return dict.fromkeys(SIMPLER_RULES, False)
    return {"point_rule_8_rounds": change.low > 1.0 and change.estimate > 1.0 + case.threshold,
            "strict_rule_8_rounds": change.estimate > 1.0}


def guard_runs(profile: NoiseProfile, slower: float, trials: int, threshold: float, settings: VerdictSettings,
               rng: np.random.Generator, approval_rounds: int = APPROVAL_ROUNDS, approval: str = "rounds") -> dict:
    """`trials` guard runs of a kernel `slower` times its approved self: verdict counts and rounds used, and how
    often the simpler rules would have called it slower."""
    verdicts: Counter = Counter()
    reasons: Counter = Counter()
    simpler: Counter = Counter()
    rounds = []
    for _ in range(trials):
        held = approved_ratio(RoundMaker(profile, 1.0, rng), settings, approval_rounds, approval)
        case = CaseInput(approval="bench", case=profile.label, threshold=threshold, **held)
        maker = RoundMaker(profile, slower, rng)
        verdict = decide_with_repeats(case, CORRECT, maker, settings)
        simpler.update(name for name, slower_called in simpler_rules(case, maker, settings).items() if slower_called)
        verdicts[verdict.verdict.value] += 1
        if verdict.reason is not None:
            reasons[verdict.reason.value] += 1
        rounds.append(verdict.rounds)
    return {"trials": trials, "verdicts": dict(verdicts), "inconclusive_reasons": dict(reasons),
            "simpler_rules_called_slower": {k: simpler.get(k, 0) for k in SIMPLER_RULES},
            "rounds_mean": float(np.mean(rounds)), "rounds_p95": float(np.percentile(rounds, 95))}


def kernel_rows(profile: NoiseProfile, threshold: float, args: argparse.Namespace, settings: VerdictSettings,
                rng: np.random.Generator) -> dict:
    row = {"kernel": profile.label, "median_us": profile.median_ms * 1000.0, "launch_sd": profile.launch_sd,
           "job_sd": profile.job_sd, "job_sd_from": profile.job_sd_from or profile.label, "sources": profile.sources,
           "model_round_ratio_sd": model_round_ratio_sd(profile, rng),
           "unchanged": guard_runs(profile, 1.0, args.unchanged, threshold, settings, rng, args.approval_rounds,
                                   args.approval)}
    for slowdown in SLOWDOWNS:
        row[f"slower_{round(slowdown * 100)}pct"] = guard_runs(profile, 1.0 + slowdown, args.slower_trials,
                                                              threshold, settings, rng, args.approval_rounds,
                                                              args.approval)
    return row


def share(runs: dict, verdict: Verdict) -> float:
    return runs["verdicts"].get(verdict.value, 0) / runs["trials"]


def totals(rows: list[dict], min_us: float = 0.0) -> dict:
    """Pooled over the kernels of at least `min_us`: false alarms per 1000, detection per slowdown."""
    kept = [r for r in rows if r["median_us"] >= min_us]
    out = {"kernels": len(kept), "min_us": min_us}

    def pooled(key: str, verdict: Verdict) -> float:
        hits = sum(r[key]["verdicts"].get(verdict.value, 0) for r in kept)
        return hits / max(1, sum(r[key]["trials"] for r in kept))

    out["false_alarms_per_1000"] = 1000.0 * pooled("unchanged", Verdict.REGRESSED)
    out["unchanged_pass"] = pooled("unchanged", Verdict.PASS)
    out["unchanged_inconclusive"] = pooled("unchanged", Verdict.INCONCLUSIVE)
    for slowdown in SLOWDOWNS:
        key = f"slower_{round(slowdown * 100)}pct"
        out[f"detected_{round(slowdown * 100)}pct"] = pooled(key, Verdict.REGRESSED)
        out[f"inconclusive_{round(slowdown * 100)}pct"] = pooled(key, Verdict.INCONCLUSIVE)
    out["rounds_mean_unchanged"] = float(np.mean([r["unchanged"]["rounds_mean"] for r in kept])) if kept else math.nan
    for rule in SIMPLER_RULES:
        def called(key: str) -> float:
            hits = sum(r[key]["simpler_rules_called_slower"][rule] for r in kept)
            return hits / max(1, sum(r[key]["trials"] for r in kept))

        out[rule] = {"false_alarms_per_1000": 1000.0 * called("unchanged"),
                     **{f"detected_{round(s * 100)}pct": called(f"slower_{round(s * 100)}pct") for s in SLOWDOWNS}}
    return out


def table(rows: list[dict]) -> list[str]:
    lines = ["| kernel | us | launch sd | job sd | false alarms /1000 | unchanged pass | 2% | 3% | 5% | "
             "rounds unchanged (mean/p95) | rounds 3% (mean/p95) |", "|" + "---|" * 11]
    for r in rows:
        u, s3 = r["unchanged"], r["slower_3pct"]
        lines.append(
            f"| {r['kernel']} | {r['median_us']:.1f} | {r['launch_sd']:.1%} | {r['job_sd']:.2%} | "
            f"{1000 * share(u, Verdict.REGRESSED):.1f} | {share(u, Verdict.PASS):.1%} | "
            + " | ".join(f"{share(r[f'slower_{p}pct'], Verdict.REGRESSED):.1%}" for p in (2, 3, 5))
            + f" | {u['rounds_mean']:.1f}/{u['rounds_p95']:.0f} | {s3['rounds_mean']:.1f}/{s3['rounds_p95']:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unchanged", type=int, default=1000)
    parser.add_argument("--slower-trials", type=int, default=300)
    parser.add_argument("--thresholds", default="0.01,0.015,0.02")
    parser.add_argument("--max-rounds", type=int, default=VerdictSettings().max_rounds)
    parser.add_argument("--confidence", type=float, default=VerdictSettings().confidence)
    parser.add_argument("--approval-rounds", type=int, default=APPROVAL_ROUNDS)
    parser.add_argument("--approval", choices=APPROVALS, default="rounds",
                        help="each approval's ratio from interleaved rounds (approve), or from the run's own "
                             "timing (approve --from-run)")
    parser.add_argument("--launches", choices=sorted(PROFILES), default="model",
                        help="the model's launches, or an H100 job's recorded ones: drawn with replacement, "
                             "or as runs of consecutive launches")
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    settings = VerdictSettings(max_rounds=args.max_rounds, confidence=args.confidence)
    profiles = sorted(PROFILES[args.launches](), key=lambda p: p.median_ms)
    report = {"settings": settings.model_dump(), "launches": args.launches, "launches_per_round": 100,
              "approval": args.approval, "approval_rounds": args.approval_rounds if args.approval == "rounds" else None,
              "approval_run_jobs": RunSettings().timing_rounds if args.approval == "run" else None,
              "recorded_aa_ratio_sd": recorded_aa_sd(), "by_threshold": {}}
    start = time.perf_counter()
    for threshold in (float(t) for t in args.thresholds.split(",")):
        rng = np.random.default_rng(args.seed)
        rows = [kernel_rows(p, threshold, args, settings, rng) for p in profiles]
        report["by_threshold"][str(threshold)] = {"rows": rows, "all": totals(rows), "from_10us": totals(rows, 10.0)}
        print(f"\nthreshold {threshold:.1%}")
        print("\n".join(table(rows)))
        for key in ("all", "from_10us"):
            print(key, json.dumps(report["by_threshold"][str(threshold)][key]))
    report["seconds"] = time.perf_counter() - start
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
