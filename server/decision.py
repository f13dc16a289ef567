"""GO or NO-GO for a replayed run: every rule of `kernel-referee replay`'s decision, and nothing else.

Pure: it reads the results of the replay's checks, its timing repeats and two environment
fingerprints, and says GO only when all of them hold; a NO-GO names each failing check, repeat
and environment field (docs/decisions.md, "A replay says GO only when everything holds").
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from harness.stats import FASTER_BEYOND_NOISE, Speedup, significance

# The facts of the fingerprint a replay must match (as lock.json records them). driver_cuda_version
# is the driver's CUDA version, nvrtc the compiler's; the SM clock and the sandbox are reported, not decisive.
ENVIRONMENT_FIELDS = ("gpu", "compute_capability", "driver_cuda_version", "nvrtc", "cuda_bindings")
# Facts that differ between any two starts of a worker: never reported as a difference.
_VOLATILE = frozenset({"event_overhead_ms", "kernel_floor_ms", "gpu_state"})  # gpu_state: clocks and temperature at start
# Where a fact came from, not what it is: the same device peaks read from the cache are not a difference.
_PROVENANCE = frozenset({"source", "measured_at"})

# Each kind of independent check a GO needs at least one of, and what it is.
REQUIRED_CHECKS = {
    "replay": "a replay of the kernel on its recorded visible cases",
    "holdout": "the holdout cases against the run's reference outputs",
    "holdout-oracle": "the holdout cases against the float64 oracle",
    "fresh-oracle": "fresh random values against the float64 oracle",
}
CheckKind = Literal["replay", "holdout", "holdout-oracle", "fresh-oracle", "compile", "referee",
                    "physical-limit",  # a re-timed median beyond the device's limit (failed only)
                    "arithmetic"]      # the kernel computes on units its task does not allow (failed only)


class CheckResult(BaseModel):
    """One independent check of the replayed kernel (usually one case)."""

    name: str                      # what a person reads: "holdout-oracle holdout-97x83x61"
    kind: CheckKind
    case: str | None = None
    against: str | None = None     # "reference" (the run's locked outputs) or "oracle"
    seed: int | None = None
    passed: bool
    reasons: list[str] = []
    detail: dict[str, Any] | None = None  # the harness's per-case report


class RepeatResult(BaseModel):
    """One interleaved A/B timing of the replayed kernel and the baseline."""

    repeat: int                    # 1-based
    speedup: Speedup | None = None  # over the baseline, geometric mean of the performance cases
    cases: dict[str, Speedup] = {}  # the same per performance case
    reasons: list[str] = []        # why there is no speedup (a timing that failed)


class EnvironmentDifference(BaseModel):
    field: str
    run: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.field}: run {self.run!r}, now {self.now!r}"


class Decision(BaseModel):
    decision: Literal["GO", "NO-GO"]
    reasons: list[str]


def _normal(value: Any) -> Any:
    """Compare as JSON: a fingerprint read back from lock.json holds lists where a live one may hold tuples."""
    value = json.loads(json.dumps(value))
    return {k: v for k, v in value.items() if k not in _PROVENANCE} if isinstance(value, dict) else value


def environment_differences(env_run: dict, env_now: dict,
                            fields: tuple[str, ...] = ENVIRONMENT_FIELDS) -> list[EnvironmentDifference]:
    return [EnvironmentDifference(field=f, run=env_run.get(f), now=env_now.get(f)) for f in fields
            if _normal(env_run.get(f)) != _normal(env_now.get(f))]


def other_environment_differences(env_run: dict, env_now: dict) -> list[EnvironmentDifference]:
    """Differences outside the decisive fields (SM clock, sandbox...): reported, not decisive."""
    rest = sorted((set(env_run) | set(env_now)) - set(ENVIRONMENT_FIELDS) - _VOLATILE)
    return environment_differences(env_run, env_now, tuple(rest))


def _check_reasons(checks: list[CheckResult]) -> list[str]:
    reasons = [f"{c.name} failed: {'; '.join(c.reasons) or 'no reason given'}"[:600] for c in checks if not c.passed]
    made = {c.kind for c in checks}
    reasons += [f"no {kind} check was made ({what})" for kind, what in REQUIRED_CHECKS.items() if kind not in made]
    return reasons


def _significance(s: Speedup) -> str:
    return significance(s.low, s.high, s.beyond_noise)


def _interval(s: Speedup) -> str:
    return f"{s.ratio:.3g}x [{s.low:.3g}, {s.high:.3g}]"


def _repeat_reasons(repeats: list[RepeatResult]) -> list[str]:
    if not repeats:
        return ["no timing repeat was made"]
    reasons = []
    for r in repeats:
        if r.reasons or r.speedup is None:
            reasons.append(f"repeat {r.repeat}: no speedup measured: {'; '.join(r.reasons) or 'no timing'}"[:600])
        elif not r.speedup.beyond_noise:
            said = {name: _significance(s) for name, s in r.cases.items()}
            cases = "; ".join(f"{name}: {words}" for name, words in said.items() if words != FASTER_BEYOND_NOISE)
            reasons.append(f"repeat {r.repeat}: speedup over the baseline {_interval(r.speedup)} is "
                           f"{_significance(r.speedup)}, where GO needs {FASTER_BEYOND_NOISE}"
                           + (f" ({cases})" if cases else ""))
    return reasons


def decide(checks: list[CheckResult], repeats: list[RepeatResult], env_run: dict, env_now: dict) -> Decision:
    """GO only if every check passed (each required kind made), every repeat is faster than the baseline
    beyond noise, and the decisive environment fields match the run's."""
    reasons = _check_reasons(checks) + _repeat_reasons(repeats)
    reasons += [f"environment differs from the run's: {d}" for d in environment_differences(env_run, env_now)]
    if reasons:
        return Decision(decision="NO-GO", reasons=reasons)
    lowest = min(repeats, key=lambda r: r.speedup.low).speedup
    return Decision(decision="GO", reasons=[
        f"all {len(checks)} independent checks passed",
        f"faster than the baseline beyond noise in all {len(repeats)} repeats (the least: {_interval(lowest)})",
        f"the environment matches the run's ({', '.join(ENVIRONMENT_FIELDS)})"])
