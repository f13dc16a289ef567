"""The guard's HTML page, in the report's style (server/report_html.py: its CSS, its escaping helpers, its
Content-Security-Policy): per approval, the verdicts, the compact diff, the environment's changes and the
trend picture (inline SVG made by guard/trend.py). Every value is escaped: case and approval names and
messages come from files a team keeps, and a store may be hostile.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from guard.outputs import ApprovalResult, GuardReport
from guard.verdict import CaseVerdict, Interval, Verdict
from server.report_html import CSP, STYLE, Safe, badge, e, facts, join, table, tag

EXTRA_STYLE = ".improved{background:#3b7dd8}.inconclusive{background:#b8860b}.incorrect{background:#7b3294}"
BADGE = {Verdict.PASS: "ok", Verdict.IMPROVED: "improved", Verdict.REGRESSED: "failed",
         Verdict.INCORRECT: "incorrect", Verdict.INCONCLUSIVE: "inconclusive"}


def _interval(value: Interval | None) -> str:
    if value is None:
        return "—"
    return (f"{(value.estimate - 1) * 100:+.2f}% [{(value.low - 1) * 100:+.2f}%, {(value.high - 1) * 100:+.2f}%]")


def _ratio(value: Interval | None) -> str:
    return "—" if value is None else f"{value.estimate:.4f} [{value.low:.4f}, {value.high:.4f}]"


def _latency(verdict: CaseVerdict) -> str:
    if verdict.latency_ms is None:
        return "—"
    text = f"{verdict.latency_ms * 1000:.4g} µs"
    if verdict.latency_change is not None:
        text += f" ({_interval(verdict.latency_change)} vs accepted)"
    return text


def _row(verdict: CaseVerdict) -> list:
    reason = verdict.reason.value if verdict.reason else ""
    aside = ", ".join(f"{k}: {n}" for k, n in sorted(verdict.set_aside.items()))
    return [verdict.case, badge(verdict.verdict.value, BADGE[verdict.verdict]), _interval(verdict.change),
            _ratio(verdict.ratio), _latency(verdict), f"{verdict.rounds_kept}/{verdict.rounds}"
            + (f" (set aside: {aside})" if aside else ""), reason or "", verdict.message]


def _trend(svg: str | None) -> Safe:
    # Made in this process by guard/trend.py `trend_svg`, which escapes every text it draws; never read
    # back from a file, which anyone with the folder could replace.
    return tag("div", join([tag("h3", "Trend"), Safe(svg)]), class_="trend") if svg else Safe("")


def _approval(result: ApprovalResult, svg: str | None) -> Safe:
    rows = [("node", result.node or "this machine"),
            ("GPU", result.fingerprint.gpu if result.fingerprint else None),
            ("driver", result.fingerprint.driver if result.fingerprint else None),
            ("seconds", f"{result.seconds:.1f}" if result.seconds is not None else None),
            ("taken as measured past their launches' shape (yardsticks)", "; ".join(
                f"the {label}'s on {case} in {len(reasons)} round(s)" for label, per_case in result.shape_waived.items()
                for case, reasons in per_case.items()) or None)]
    changes = (tag("ul", join(tag("li", c) for c in result.environment_changes)) if result.environment_changes
               else tag("p", "the same environment as the approval", class_="muted"))
    diff = tag("pre", "\n".join(d.text for d in result.diff), class_="text") if result.diff else Safe("")
    return tag("section", join([
        tag("h2", f"{result.approval}", id=f"approval-{result.approval}"),
        facts([(k, v) for k, v in rows if v is not None]),
        table(["case", "verdict", "change since accepted", "ratio to baseline", "latency", "rounds kept",
               "reason", "message"], [_row(v) for v in result.verdicts]),
        tag("h3", "Compact diff"), diff,
        tag("h3", "Environment against the approval"), changes,
        _trend(svg)]), class_="attempt")


def _headline(report: GuardReport) -> Safe:
    counts = report.counts()
    words = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no cases"
    return tag("p", f"exit status {report.exit_status}: {words}", class_="headline")


def render_guard_page(report: GuardReport, trend_svgs: Mapping[str, str] | None = None) -> str:
    """The page; `trend_svgs` maps an approval to its trend picture (guard/trend.py `trend_svg`)."""
    trend_svgs = trend_svgs or {}
    title = f"kernel-referee guard: {report.store}"
    nav = join(tag("a", r.approval, href=f"#approval-{r.approval}") for r in report.results)
    body = join([tag("h1", title), tag("p", f"run at {report.time}", class_="muted"), tag("nav", nav),
                 _headline(report), join(_approval(r, trend_svgs.get(r.approval)) for r in report.results)])
    head = join([Safe('<meta charset="utf-8">'),
                 Safe(f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">'),
                 Safe('<meta name="viewport" content="width=device-width, initial-scale=1">'),
                 tag("title", title), tag("style", Safe(STYLE + EXTRA_STYLE))])
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>\n{body}\n</body>\n</html>\n'


def write_html(report: GuardReport, path: Path, trend_svgs: Mapping[str, str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_guard_page(report, trend_svgs), encoding="utf-8")
    return path
