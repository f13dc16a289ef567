"""`kernel-referee guard STORE`: every approval of the store replayed on this GPU (or a Ray fleet's), decided,
recorded in the store's history, and written out for CI.

The store is verified first (guard/store.py): one that does not verify raises StoreRefused, which the command
line turns into exit 2 naming what changed, and nothing is measured. Without a GPU (and without `--ray`) the
guard says why and exits 3. Then each approval's guard step (guard/step.py): correctness, interleaved rounds
beside its baseline, a verdict per case. Each run is appended to the approval's history, the outputs asked for
are written, and `--accept` makes a passing run on a new environment the approval's accepted baseline, signed
again (guard/accept.py). The exit status: 0 every case passed (or improved), 1 any regressed or incorrect,
4 any left inconclusive after the bound of repeats.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

from guard import accept as accepting
from guard import fleet, history, outputs
from guard.measure import MakeExecutor, local_executor
from guard.step import StepResult, guard_approval
from guard.store import LoadedApproval, load_store
from guard.outputs_html import write_html
from guard.outputs_junit import write_junit
from guard.trend import write_trend
from guard.verdict import VerdictSettings, exit_status
from harness.device import gpu_absent_reason
from server.settings import sandbox_refusal

EXIT_PASS, EXIT_FAILED, EXIT_STORE_REFUSED, EXIT_NO_GPU, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
KEY_VARIABLE = "KERNEL_REFEREE_APPROVAL_KEY"  # --accept's key when none is given (as approve's)
# The default of `--ray` without an address: the cluster this host belongs to, else a local one.
RAY_AUTO = "auto"


@dataclass
class GuardOptions:
    store: Path
    only: list[str] | None = None
    junit: Path | None = None
    json: Path | None = None
    html: Path | None = None
    accept: bool = False
    key: Path | None = None
    ray: str | None = None  # None: this host; RAY_AUTO or an address: a Ray cluster (guard/fleet.py)
    confine: bool = True
    gpu: str | None = None
    settings: VerdictSettings = field(default_factory=VerdictSettings)
    # None: a GpuExecutor on this host's GPU; tests pass the fake executor's maker
    make_executor: Callable[[LoadedApproval], MakeExecutor] | None = None
    # What each Ray task asks of its node: one GPU; tests ask for a custom resource standing in for one
    fleet_resources: dict = field(default_factory=lambda: {"num_gpus": 1})

    @classmethod
    def of(cls, args) -> GuardOptions:
        """The options from `kernel-referee guard`'s parsed arguments (guard/cli.py)."""
        return cls(store=args.store, only=args.only, junit=args.junit, json=args.json, html=args.html,
                   accept=args.accept, key=args.key, ray=args.ray, confine=not args.no_sandbox, gpu=args.gpu)


def main(args) -> int:
    return run_guard(GuardOptions.of(args), sys.stdout)


class NoGpu(Exception):
    """Nothing here can measure: no GPU on this host, or none in the Ray cluster (exit 3)."""


class SandboxRefused(Exception):
    """The workers cannot be confined here, and --no-sandbox was not given (exit 2)."""


def run_guard(options: GuardOptions, out: TextIO) -> int:
    """Verify, measure, decide, record, write; the exit status."""
    loaded = load_store(options.store, options.only)  # StoreRefused: the command line's exit 2
    print(f"{options.store}: {len(loaded)} approval(s) verified: {', '.join(a.name for a in loaded)}", file=out)
    try:
        results = guard_results(options, loaded)
    except NoGpu as absent:
        print(f"kernel-referee guard needs an NVIDIA GPU: {absent}. The store verifies; nothing was measured and no "
              "history was written.", file=sys.stderr)
        return EXIT_NO_GPU
    except SandboxRefused as refused:
        print(f"kernel-referee: {refused}", file=sys.stderr)
        return EXIT_STORE_REFUSED
    return finish(options, loaded, results, out)


def guard_results(options: GuardOptions, loaded: list[LoadedApproval]) -> list[StepResult]:
    """Every approval's guard step, on this host's GPU or fanned out over Ray, in the approvals' order."""
    if options.ray is not None:
        try:
            return fleet.guard_fleet(options, loaded, _say)
        except fleet.NoFleetGpu as absent:
            raise NoGpu(str(absent)) from None
    if options.make_executor is None:
        absent = gpu_absent_reason()
        if absent is not None:
            raise NoGpu(absent)
        refusal = sandbox_refusal(options.confine)
        if refusal:
            raise SandboxRefused(refusal)
    make = options.make_executor or (lambda approval: local_executor(approval.name, options.confine, options.gpu))
    return [guard_approval(approval, make(approval), options.settings, _say) for approval in loaded]


def finish(options: GuardOptions, loaded: list[LoadedApproval], results: list[StepResult], out: TextIO) -> int:
    """The results of every approval, however measured: --accept, history and its compact diff, the outputs, the
    printed diff; the exit status."""
    time = history.now_iso()
    accepted: set[str] = set()
    if options.accept:
        by_name = {approval.name: approval for approval in loaded}
        for result in results:
            said = accepting.accept(options.store, by_name[result.approval], result, _accept_key(options))
            accepted |= {result.approval} if accepting.ACCEPTED in said else set()
            print(said, file=out)
    folder = next((p.parent for p in (options.html, options.json, options.junit) if p is not None), None)
    recorded = [_recorded(options.store, result, result.approval in accepted, time, folder) for result in results]
    report = outputs.GuardReport(time=time, store=str(options.store), results=[shown for shown, _ in recorded])
    # The page inlines each approval's trend picture as drawn in this process, never read back from the folder.
    trend_svgs = {shown.approval: svg for shown, svg in recorded if svg is not None}
    for path, write in ((options.json, outputs.write_json), (options.junit, write_junit),
                        (options.html, partial(write_html, trend_svgs=trend_svgs))):
        if path is not None:
            print(f"wrote {write(report, path)}", file=out)
    print_results(report, results, out)
    outputs.print_annotations(report, out)
    return report.exit_status


def _recorded(store: Path, result: StepResult, accepted: bool, time: str,
              folder: Path | None) -> tuple[outputs.ApprovalResult, str | None]:
    """The run appended to the approval's history, its compact diff against the earlier runs, and its trend
    pictures (beside the outputs, where any is written); with the trend's SVG text, where drawn."""
    earlier = history.read(store, result.approval)
    diff = history.compact_diff(result.approval, result.verdicts, earlier)
    record = history.record_of(result.approval, result.verdicts, result.fingerprint, accepted=accepted,
                               exit_status=exit_status(result.verdicts), time=time,
                               shape_waived=result.shape_waived)
    history.append(store, record)
    pictures: dict[str, str] = {}
    svg = None
    if folder is not None:
        trend = write_trend(folder, result.approval, earlier + [record])
        pictures, svg = {"trend_svg": trend.svg.name, "trend_png": trend.png.name}, trend.svg_text
    return outputs.ApprovalResult(approval=result.approval, verdicts=result.verdicts, diff=diff,
                                  environment_changes=result.environment_changes, fingerprint=result.fingerprint,
                                  node=result.node, seconds=result.cost.total_s, lease_waits=result.lease_waits,
                                  shape_waived=result.shape_waived, **pictures), svg


def _accept_key(options: GuardOptions) -> Path | None:
    return options.key or (Path(os.environ[KEY_VARIABLE]) if os.environ.get(KEY_VARIABLE) else None)


def print_results(report: outputs.GuardReport, results: list[StepResult], out: TextIO) -> None:
    """Per approval and case: its compact diff line; the checks that failed; the environment's differences."""
    for shown, result in zip(report.results, results):
        print(f"{result.approval} on {result.node} ({result.fingerprint.gpu or 'no GPU'}):", file=out)
        for verdict in shown.verdicts:
            print(f"  {outputs.diff_text(shown, verdict)}", file=out)
        for check in result.checks:
            if not check.passed:
                print(f"  FAIL {check.name}: {'; '.join(check.reasons)[:300]}", file=out)
        for label, per_case in result.shape_waived.items():
            for case, reasons in per_case.items():
                print(f"  {case}: the {label}'s timing taken as measured though its launches' shape was refused, "
                      f"in {len(reasons)} round(s) (a yardstick): {reasons[0][:200]}", file=out)
        if result.environment_changes:
            print(f"  environment differs from the approval's: {'; '.join(result.environment_changes)}", file=out)


def _say(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)
