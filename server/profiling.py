"""profile_kernel: one launch of a valid candidate under Nsight Compute, digested for the agent.

A probe (charged to the window, with its own GPU-time cap: RunSettings.profile_gpu_seconds_per_window), off
unless the run was served with --profile. It never feeds a verdict: record_attempt's timing never runs under
the profiler, and the profiled worker is a one-shot process of its own (harness/ncu_profile.py).
"""

from __future__ import annotations

import re
import time
from typing import Callable

from harness.call_limits import OutOfTime
from harness.ncu_profile import ProfilingUnavailable
from harness.profile_digest import METRICS, NcuFormatError, digest
from server.lease_waits import LeaseWatch
from server.models import ProfileAnswer
from server.probes import compiled_kernel, require_valid
from server.run import PROFILE_TOOL, Candidate, Progress, Refusal, Run

PROFILES = "referee://profiles/{profile}"
PROFILE_ID = re.compile(r"p[0-9]{3,}")
PROFILING_OFF = "profiling is off for this run: the operator starts the server with `serve --profile` to turn it on"


def profile_path(profile_id: str) -> str:
    return f"profiles/{profile_id}.csv"


def profile_candidate(run: Run, make_candidate: Callable[[], Candidate], case_name: str | None,
                      progress: Progress | None = None) -> ProfileAnswer:
    """Validate (a wrong kernel is never profiled), then profile one launch on one performance case."""
    if not run.settings.profile:
        raise Refusal(PROFILING_OFF)
    _charge(run)
    case = run.cases_named([case_name] if case_name else None, performance_only=True)[0]
    candidate = make_candidate()
    kernel = compiled_kernel(run, PROFILE_TOOL, candidate)
    watch = LeaseWatch(run.executor, progress)  # a wait for another process's timing is told and recorded
    progress = watch.report
    started, text = time.perf_counter(), None
    try:
        if progress:
            progress(0, 2, "validating on the visible cases")
        require_valid(run, kernel, candidate, "profiled")
        if progress:
            progress(1, 2, f"profiling one launch on {case.name} with Nsight Compute")
        text = run.executor.profile(kernel, case, METRICS)
    except OutOfTime as out:
        raise Refusal(f"profile_kernel stopped: {out}. The probe is counted.") from None
    except ProfilingUnavailable as why:
        raise Refusal(f"no profile: {why}. The probe is counted; the run goes on.") from None
    finally:
        run.probe_done(PROFILE_TOOL, time.perf_counter() - started - watch.waited_s(),
                       {"candidate": candidate.id, "case": case.name, "profiled": text is not None, **watch.record()})
    return _answer(run, candidate, case.name, text)


def _charge(run: Run) -> None:
    run.charge_probe()
    cap = run.settings.profile_gpu_seconds_per_window
    if run.profile_seconds_in_window >= cap:
        raise Refusal(f"profile_kernel's GPU time for this attempt window is spent ({cap:g} s); the other probes "
                      "still answer. Record an attempt to open a new window.")


def _answer(run: Run, candidate: Candidate, case: str, text: str) -> ProfileAnswer:
    profile_id = f"p{len(list((run.dir / 'profiles').glob('p*.csv'))) + 1:03d}"
    run.write_text(profile_path(profile_id), text)  # the full report, kept whatever the digest makes of it
    try:
        digested = digest(text)
    except NcuFormatError as exc:
        raise Refusal(f"no profile: {exc}; ncu's output is kept as {PROFILES.format(profile=profile_id)}") from None
    return ProfileAnswer(candidate=candidate.id, case=case, profile=profile_id,
                         resource=PROFILES.format(profile=profile_id), digest=digested, budget=run.budget())
