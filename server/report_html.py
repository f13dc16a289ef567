"""report.html: one self-contained page (inline CSS, the heatmap as inline SVG, no script, no external URL).

Every value is escaped with html.escape: kernel sources, rationales, usage, the finish reason and
compiler logs are written by the agent and are hostile. Control characters (NUL among them) and lone
surrogates, which HTML cannot carry, are written as visible escapes (`\x00`, `\ud800`). A
Content-Security-Policy that allows no script and no external resource is a second fence, not the first.
"""

from __future__ import annotations

import json
import re
import shlex
from html import escape

from harness.stats import significance
from server.records import NO_INDEPENDENT_ORACLE, SpeedupRecord, Verdict, holdout_oracle_words
from server.report import AttemptView, CaseRow, RunReport
from server.report_environment import environment_rows

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CAVEAT = ("Kernel latency is not the end-to-end saving: the sheet uses the milliseconds saved END TO END per "
          "invocation, measured after integration. A kernel's event-timed latency (below) is for comparison only.")
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;
color:#1a1a1a;background:#fff;line-height:1.4}
h1{font-size:1.6em;margin-bottom:4px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top;font-size:.92em}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;border:1px solid #e2e2e2;padding:8px;overflow-x:auto;font-size:.85em;white-space:pre}
pre.text{white-space:pre-wrap;word-break:break-word}.headline{font-size:1.1em;background:#f0f6ff;padding:10px;
border-left:4px solid #3b7dd8}.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:.85em;
font-weight:600;color:#fff}.baseline{background:#3b7dd8}.valid-faster,.GO,.ok{background:#1a9850}
.valid-not-faster{background:#b8860b}.rejected,.NO-GO,.failed,.DQ{background:#d73027}.unknown{background:#777}
.diff .add{color:#0a6b2b;background:#e6ffed}.diff .del{color:#a1141a;background:#ffeef0}.diff .hunk{color:#6f42c1}
.muted{color:#666}details{margin:6px 0}summary{cursor:pointer}nav a{margin-right:12px}
section.attempt{border:1px solid #e2e2e2;border-radius:6px;padding:4px 14px;margin:12px 0}
"""


class Safe(str):
    """HTML made here from escaped parts; everything else is escaped before it is written."""


# C0 controls but tab, newline and carriage return; DEL and the C1 controls; lone surrogates (no UTF-8 form).
_UNWRITABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _visible(char: re.Match) -> str:
    code = ord(char.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def e(value) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(_UNWRITABLE.sub(_visible, escape("" if value is None else str(value), quote=True)))


def join(parts) -> Safe:
    return Safe("".join(e(p) for p in parts))


def tag(name: str, content="", **attributes) -> Safe:
    attrs = "".join(f' {k.rstrip("_").replace("_", "-")}="{e(v)}"' for k, v in attributes.items() if v is not None)
    return Safe(f"<{name}{attrs}>{e(content)}</{name}>")


def badge(text: str, kind: str | None = None) -> Safe:
    return tag("span", text, class_=f"badge {kind or text}")


def table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> Safe:
    head = join(tag("th", h) for h in headers)
    body = join(tag("tr", join(tag("td", c, class_="num" if i in numeric else None) for i, c in enumerate(row)))
                for row in rows)
    return tag("table", join([tag("tr", head), body]))


def facts(rows: list[tuple[str, object]]) -> Safe:
    return tag("table", join(tag("tr", join([tag("th", k), tag("td", v)])) for k, v in rows))


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    us = ms * 1000
    return f"{us:,.0f} µs" if us >= 10000 else f"{us:.4g} µs"


def fmt_speedup(s: SpeedupRecord | None) -> str:
    if s is None:
        return "—"
    interval = "" if s.low is None or s.high is None else f" [{s.low:.2f}–{s.high:.2f}]"
    return f"{s.ratio:.2f}×{interval}, {significance(s.low, s.high, s.beyond_noise)}"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.3g} s" if seconds < 120 else f"{seconds / 60:.1f} min ({seconds / 3600:.3f} h)"


def fmt_value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# -- sections ---------------------------------------------------------------------------------

def _headline(r: RunReport) -> Safe:
    best = next((a for a in r.attempts if a.is_best), None)
    parts = [f"Best: attempt {r.best_attempt}" if r.best_attempt is not None else "Best: —"]
    if best is not None and best.number != 0:
        parts.append(f", speedup vs the baseline {fmt_speedup(r.best_speedup)}")
    elif best is not None:
        parts.append(" (the baseline: no attempt beat it)")
    holdout = r.holdout
    parts.append(". Holdout: " + ("not checked yet" if holdout is None else
                                  "passed" if holdout.get("passed") else "FAILED"))
    if holdout is not None and holdout.get("oracle_used") is False:
        parts.append(f" ({NO_INDEPENDENT_ORACLE})")
    parts.append(f". Stop reason: {r.stop_reason or '—'} (status {r.status}).")
    return tag("p", join(parts), class_="headline")


def _facts(r: RunReport) -> Safe:
    counts = {k: sum(1 for a in r.attempts if a.number > 0 and cond(a)) for k, cond in (
        ("recorded", lambda a: True), ("valid", lambda a: a.verdict in (Verdict.VALID_FASTER, Verdict.VALID_NOT_FASTER)),
        ("valid-faster", lambda a: a.verdict == Verdict.VALID_FASTER), ("rejected", lambda a: a.rejected))}
    timing = r.settings.get("timing") if isinstance(r.settings.get("timing"), dict) else {}
    usage = ", ".join(f"{k} {v:g}" for k, v in sorted(r.usage_totals.items())) or "not given by the client"
    rows = [("task", r.task), ("run folder", str(r.run_dir)), ("status", r.status),
            ("stop reason", r.stop_reason or "—"),
            ("created", r.created or "—"), ("last update", r.updated or "—"),
            ("wall time (created to last update)", fmt_seconds(r.wall_seconds)),
            ("GPU time (busy)", fmt_seconds(r.gpu_seconds)), ("compiles", r.compiles), ("probes", r.probes),
            ("budget", f"{r.budget.get('used', '?')} of {r.budget.get('max_attempts', '?')} attempts used, "
                       f"{r.budget.get('left', '?')} left"),
            ("attempts", ", ".join(f"{v} {k}" for k, v in counts.items())),
            ("agent usage (sum over attempts)", usage),
            ("probes per window", r.settings.get("probes_per_window", "—")),
            ("Nsight Compute profiles", ", ".join(r.profiles) or ("none" if r.settings.get("profile") else "off")),
            ("timing protocol", ", ".join(f"{k}={fmt_value(v)}" for k, v in timing.items()) or "—"),
            ("timing rounds (interleaved)", r.settings.get("timing_rounds", "—"))]
    lock = [("task and expected outputs", f"{r.lock.get('files_sha256') or '—'} ({r.lock.get('files')} files)"),
            ("referee source", f"{r.lock.get('referee_source_sha256') or '—'} ({r.lock.get('referee_source_modules')} modules)")]
    env = environment_rows(r.environment)
    return join([tag("h2", "Run", id="facts"), facts(rows), tag("h3", "Lock (sha256, lock.json)"), facts(lock),
                 tag("h3", "Environment"), facts(env) if env else tag("p", "not recorded", class_="muted")])


def _holdout(r: RunReport) -> Safe:
    h = r.holdout
    if h is None:
        body = tag("p", "Not checked yet: the holdout cases are checked when the run finishes.", class_="muted")
    else:
        passed = bool(h.get("passed"))
        rows = [("result", badge("passed", "ok") if passed else badge("failed")), ("attempt", h.get("attempt")),
                ("cases", ", ".join(str(c) for c in h.get("cases") or [])),
                ("oracle (float64)", holdout_oracle_words(h)),
                ("disqualified", ", ".join(str(n) for n in r.disqualified) or "none")]
        if h.get("note"):
            rows.append(("note", h["note"]))
        reasons = [r_ for r_ in h.get("reasons") or [] if isinstance(r_, dict)]
        body = join([facts(rows), _reason_list([(x.get("code"), x.get("case"), x.get("detail")) for x in reasons])])
    return join([tag("h2", "Holdout", id="holdout"), body, _replay(r)])


def _replay(r: RunReport) -> Safe:
    title = tag("h3", "Replay decision (replay.json)")
    if r.replay is None:
        return join([title, tag("p", "No replay.json yet: `kernel-referee replay RUN` writes it.", class_="muted")])
    rows = [("decision", badge(r.replay.decision) if r.replay.decision else badge("unreadable", "unknown"))]
    if r.replay.problem:
        rows.append(("problem", r.replay.problem))
    return join([title, facts(rows), tag("ul", join(tag("li", x) for x in r.replay.reasons))])


def _heatmap(r: RunReport, svg: str) -> Safe:
    # The SVG is built by server.heatmap, which escapes every label it writes.
    links = join(["Also in the run folder: ", tag("a", "heatmap.png", href="heatmap.png"), ", ",
                  tag("a", "heatmap.svg", href="heatmap.svg"), "."])
    return join([tag("h2", "Latency heatmap", id="heatmap"), Safe(svg), tag("p", links)])


def _overview(r: RunReport) -> Safe:
    rows = []
    for a in r.attempts:
        note = a.reasons[0].code + (f" [{a.reasons[0].case}]" if a.reasons[0].case else "") if a.reasons else ""
        mark = " (best)" if a.is_best else " (disqualified at the holdout)" if a.disqualified else ""
        rationale = (a.rationale or "")[:140] + ("…" if len(a.rationale or "") > 140 else "")
        rows.append([tag("a", str(a.number), href=f"#attempt-{a.number}"), join([badge(a.verdict, _kind(a)), mark]),
                     fmt_ms(a.score_ms), fmt_speedup(a.speedup_vs_baseline),
                     "—" if a.number == 0 else join([fmt_speedup(a.speedup_vs_best),
                                                     f" (vs attempt {a.parent})" if a.parent is not None else ""]),
                     note, rationale])
    kinds = [[k, v] for k, v in sorted(r.rejections_by_kind.items(), key=lambda kv: (-kv[1], kv[0]))]
    return join([tag("h2", "Attempts", id="attempts"),
                 table(["#", "verdict", "score (geomean of medians)", "speedup vs baseline",
                        "speedup vs parent (the best before it)", "first reason", "rationale"], rows, {2}),
                 tag("h3", "Rejections by kind (first reason of each rejected attempt)"),
                 table(["kind", "attempts"], kinds, {1}) if kinds else tag("p", "none", class_="muted")])


def _kind(a: AttemptView) -> str:
    return a.verdict if a.verdict in tuple(Verdict) else "unknown"


def _reason_list(reasons: list[tuple]) -> Safe:
    if not reasons:
        return Safe("")
    items = (join([tag("b", code), f" [{case}]" if case else "", ": ", tag("pre", detail, class_="text")])
             for code, case, detail in reasons)
    return tag("ul", join(tag("li", item) for item in items))


def _case_rows(cases: list[CaseRow]) -> Safe:
    rows = [[c.case, fmt_ms(c.median_ms),
             "—" if c.ci_low_ms is None else f"{fmt_ms(c.ci_low_ms)} – {fmt_ms(c.ci_high_ms)}",
             "—" if c.p10_ms is None else f"{fmt_ms(c.p10_ms)} – {fmt_ms(c.p90_ms)}",
             "—" if c.cv is None else f"{c.cv:.2%}", c.samples if c.samples is not None else "—",
             fmt_ms(c.baseline_median_ms),
             "—" if c.relative_to_baseline is None else f"{c.relative_to_baseline:.3f}",
             fmt_speedup(c.speedup_vs_baseline), fmt_speedup(c.speedup_vs_best)] for c in cases]
    return table(["case", "median", "95% CI of the median", "p10 – p90", "cv", "samples", "baseline median (beside)",
                  "latency / baseline", "speedup vs baseline", "speedup vs parent"], rows, {1, 4, 5, 6, 7})


def _diff(a: AttemptView) -> Safe:
    if a.previous is None:
        return tag("p", "The baseline: no earlier attempt to compare with." if a.number == 0
                   else "No earlier source to compare with.", class_="muted")
    classes = {"+": "add", "-": "del", "@": "hunk"}
    lines = join(tag("span", line + "\n", class_=None if line.startswith(("+++", "---")) else classes.get(line[:1]))
                 for line in a.diff)
    more = f" (first {len(a.diff)} lines)" if a.diff_truncated else ""
    summary = f"diff against attempt {a.previous}: {len(a.diff)} lines{more}" if a.diff else \
        f"diff against attempt {a.previous}: identical source"
    return tag("details", join([tag("summary", summary), tag("pre", lines, class_="diff") if a.diff else ""]),
               open="open" if a.diff else None)


def _attempt(a: AttemptView) -> Safe:
    heading = join([f"Attempt {a.number} ", badge(a.verdict, _kind(a)),
                    " best" if a.is_best else "", " ", badge("DQ") if a.disqualified else ""])
    rows = [("parent (the best before it)", a.parent if a.parent is not None else "—"),
            ("score (geomean of case medians)", fmt_ms(a.score_ms)),
            ("speedup vs baseline", fmt_speedup(a.speedup_vs_baseline)),
            ("speedup vs parent", fmt_speedup(a.speedup_vs_best) if a.number else "—"),
            ("compile options", " ".join(a.options) or "none"),
            ("launch", fmt_value(a.launch) if a.launch is not None else "—"),
            ("resources", ", ".join(f"{k} {v}" for k, v in (a.resources or {}).items()) or "—"),
            ("arithmetic (its SASS)", a.arithmetic or "—"),
            ("agent usage", ", ".join(f"{k} {fmt_value(v)}" for k, v in a.usage.items()) if a.usage else
             "not given")]
    if a.flags:
        rows.append(("flagged (re-verified)", "; ".join(a.flags)))
    if a.disqualified:
        rows.append(("holdout", "failed the holdout cases: disqualified"))
    parts = [tag("h3", heading), facts(rows)]
    if a.reasons:
        parts += [tag("h4", "Reasons"), _reason_list([(x.code, x.case, x.detail) for x in a.reasons])]
    if a.rationale is not None:
        parts += [tag("h4", "Rationale (written by the agent)"), tag("pre", a.rationale, class_="text")]
    if a.cases:
        parts += [tag("h4", "Latency per performance case"), _case_rows(a.cases)]
    parts.append(_diff(a))
    parts.append(tag("details", join([tag("summary", f"source attempts/{a.number:03d}.cu"),
                                      tag("pre", a.source if a.source is not None else "(missing)")])))
    return tag("section", join(parts), class_="attempt", id=f"attempt-{a.number}")


def _cost(r: RunReport) -> Safe:
    c = r.cost
    rows = [("GPU wall-clock hours held (the run)", "—" if c.wall_hours is None else f"{c.wall_hours:.4f} h"),
            ("GPU busy hours (the run)", "—" if c.gpu_busy_hours is None else f"{c.gpu_busy_hours:.5f} h"),
            ("kernel ms saved per call (geomean, for comparison only)",
             "—" if c.kernel_ms_saved is None else f"{c.kernel_ms_saved:.5f} ms")]
    parts = [tag("h2", "Cost sheet", id="cost"), tag("p", CAVEAT, class_="headline"), facts(rows)]
    s = c.sheet
    if s is None:
        parts.append(tag("p", "For the full sheet pass the cost options: kernel-referee report RUN --engineer-hours H "
                              "--hourly-rate R --model-cost M --gpu-hour-cost G --invocations-per-month N "
                              "--ms-saved-end-to-end S (or kernel-referee cost RUN ...).", class_="muted"))
    else:
        i = s.inputs
        payback = "never (nothing saved)" if s.payback_months is None else f"{s.payback_months:.2f} months"
        parts.append(facts([
            ("pilot cost", f"{s.pilot_cost:.2f} = engineering {s.engineering_cost:.2f} ({i.engineer_hours:g} h × "
                           f"{i.hourly_rate:g}) + model {i.model_cost:.2f} + GPU {s.gpu_cost:.2f} "
                           f"({s.run_wall_hours:.3f} h held × {i.gpu_hour_cost:g})"),
            ("saved GPU hours per month", f"{s.saved_gpu_hours_per_month:.4f} = {i.ms_saved_end_to_end:g} ms end to "
                                          f"end × {i.invocations_per_month:,.0f} invocations / 3,600,000"),
            ("monthly saving", f"{s.monthly_saving:.2f}"), ("payback", payback)]))
    return join(parts)


def _audit(r: RunReport) -> Safe:
    a = r.audit
    rows = [("kernel-referee verify", badge("ok") if a.ok else badge("failed")), ("records", a.records),
            ("chain head", a.head or "—")]
    parts = [tag("h2", "Audit log", id="audit"), facts(rows)]
    if a.problems:
        parts.append(tag("ul", join(tag("li", p) for p in a.problems)))
    for title, header, counts in (("Events by kind", "kind", r.event_counts), ("Tool calls", "tool", r.calls_by_tool)):
        parts.append(tag("h3", title))
        parts.append(table([header, "count"], [[k, v] for k, v in sorted(counts.items())], {1}) if counts
                     else tag("p", "none", class_="muted"))
    return join(parts)


def _commands(r: RunReport) -> Safe:
    run = shlex.quote(str(r.run_dir))
    text = (f"kernel-referee replay {run}    # re-run the best on each visible case, GO / NO-GO\n"
            f"kernel-referee verify {run}    # recompute the hash chain and the recorded files\n"
            f"kernel-referee report {run}    # write this report again\n")
    return join([tag("h2", "Replay", id="replay"), tag("pre", text)])


def render_report(r: RunReport, heatmap_svg: str) -> str:
    nav = join(tag("a", text, href=f"#{anchor}") for anchor, text in (
        ("facts", "run"), ("holdout", "holdout"), ("heatmap", "heatmap"), ("attempts", "attempts"),
        ("cost", "cost"), ("audit", "audit"), ("replay", "replay")))
    problems = tag("ul", join(tag("li", p) for p in r.problems)) if r.problems else ""
    body = join([tag("h1", f"kernel-referee report: {r.task}, {r.run_name}"), tag("nav", nav), _headline(r),
                 problems, _facts(r), _holdout(r), _heatmap(r, heatmap_svg), _overview(r),
                 tag("h2", "Each attempt", id="details"), join(_attempt(a) for a in r.attempts), _cost(r), _audit(r),
                 _commands(r)])
    head = join([Safe('<meta charset="utf-8">'),
                 Safe(f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">'),
                 Safe('<meta name="viewport" content="width=device-width, initial-scale=1">'),
                 tag("title", f"kernel-referee report: {r.task}, {r.run_name}"), tag("style", Safe(STYLE))])
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>\n{body}\n</body>\n</html>\n'
