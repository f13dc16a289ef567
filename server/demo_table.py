"""What `kernel-referee demo` prints: one line per tool answer while it runs, a table at the end.

Printers only format: they take the tools' answers (JSON-shaped dicts, as an MCP client receives
them) and never call anything. Latencies are in milliseconds; "-" marks what was not measured.
"""

from __future__ import annotations

import math

from harness.stats import significance
from server.records import NO_INDEPENDENT_ORACLE, Verdict

DASH = "-"


def compile_line(answer: dict) -> str:
    """compile_kernel's answer in one line: resources, or that it failed."""
    if not answer["ok"]:
        return f"compile FAILED ({answer['compile_ms']:.0f} ms)"
    r = answer.get("resources")
    report = "no resource report" if r is None else (
        f"{r['registers']} registers, {r['spill_bytes']} spill bytes, {r['shared_bytes']} B shared, "
        f"{r['stack_bytes']} B stack")
    return f"compiled in {answer['compile_ms']:.0f} ms: {report}"


def reasons_text(answer: dict, limit: int = 2) -> str:
    reasons = answer.get("reasons") or []
    if not reasons:
        return DASH
    shown = [f"{r['code']} [{r['case']}]" if r.get("case") else r["code"] for r in reasons[:limit]]
    more = f" +{len(reasons) - limit}" if len(reasons) > limit else ""
    return ", ".join(shown) + more


def speedup_text(speedup: dict | None) -> str:
    """The ratio, its 95% interval and what the interval says (harness.stats.significance)."""
    if not speedup:
        return DASH
    words = significance(speedup.get("low"), speedup.get("high"), speedup.get("beyond_noise"))
    return f"{speedup['ratio']:.2f}x [{speedup['low']:.2f}, {speedup['high']:.2f}] {words}"


def attempt_line(answer: dict) -> str:
    """record_attempt's answer in one line."""
    line = f"attempt {answer['attempt']} {answer['verdict']}"
    if answer["verdict"] == Verdict.REJECTED:
        return f"{line}: {reasons_text(answer)}"
    return (f"{line}, {answer['score_ms']:.3f} ms; vs baseline {speedup_text(answer.get('speedup_vs_baseline'))}; "
            f"vs the best before it {speedup_text(answer.get('speedup_vs_best'))}")


def _geomean_ratio(numerators: dict[str, float], denominators: dict[str, float], cases: list[str]) -> float | None:
    """Geometric mean over `cases` of numerator / denominator; None unless every case has both."""
    if not cases or any(not numerators.get(c) or not denominators.get(c) for c in cases):
        return None
    return math.exp(sum(math.log(numerators[c] / denominators[c]) for c in cases) / len(cases))


def _ratio_text(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio:.2f}x"


def ms_text(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}"


def render_table(description: dict, attempts: list[tuple[str, dict]], summary: dict | None = None) -> str:
    """The baseline, every attempt (label, record_attempt answer) and cuBLAS when describe_task has it.

    "vs baseline" is the referee's own interleaved speedup with its 95% interval; "vs cuBLAS" is the
    geometric mean over the performance cases of cuBLAS's median over the attempt's.
    """
    cases = [c["name"] for c in description["cases"] if c["role"] == "performance"]
    baseline = {c["name"]: c.get("baseline_median_ms") for c in description["cases"]}
    vendor = description.get("vendor") or None
    vendor_ms = dict(vendor.get("cases") or {}) if vendor else {}
    best = (summary or {}).get("best_attempt", description.get("best_attempt"))
    header = ["#", "kernel", "verdict", "reasons"] + [f"{c} ms" for c in cases] + ["vs baseline", "vs cuBLAS"]

    def row(number: str, label: str, verdict: str, reasons: str, medians: dict, vs_baseline: str) -> list[str]:
        vs_vendor = _ratio_text(_geomean_ratio(vendor_ms, medians, cases))
        return [number, label, verdict, reasons] + [ms_text(medians.get(c)) for c in cases] + [vs_baseline, vs_vendor]

    rows = [row("0" + ("*" if best == 0 else ""), "baseline (initial.cu)", Verdict.BASELINE.value, DASH, baseline, "1.00x")]
    for label, answer in attempts:
        medians = {r["case"]: r["stats"]["median_ms"] for r in answer.get("cases") or []}
        rows.append(row(str(answer["attempt"]) + ("*" if answer["attempt"] == best else ""), label, answer["verdict"],
                        reasons_text(answer), medians, speedup_text(answer.get("speedup_vs_baseline"))))
    if vendor:
        rows.append(row(DASH, vendor.get("name", "vendor"), "(yardstick)", DASH, vendor_ms,
                        _ratio_text(_geomean_ratio(baseline, vendor_ms, cases))))
    lines = _columns(header, rows)
    lines.append("* the run's best attempt. vs baseline: the referee's interleaved timing, 95% interval in brackets, "
                 "and what the interval says."
                 + ("" if vendor else " vs cuBLAS: no cuBLAS timing in describe_task (-)."))
    lines += _footer(summary)
    return "\n".join(lines)


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned text columns, latencies and ratios right-aligned."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    right = {i for i, h in enumerate(header) if h.endswith(" ms") or h.startswith("vs ")}

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _footer(summary: dict | None) -> list[str]:
    if not summary:
        return []
    lines = []
    best, speedup = summary.get("best_attempt"), summary.get("speedup_vs_baseline")
    if best:
        lines.append(f"best: attempt {best}, vs the baseline {speedup_text(speedup)}")
    else:
        lines.append("best: the baseline (no attempt beat it beyond noise)")
    holdout = summary.get("holdout")
    if holdout:
        verdict = "passed" if holdout.get("passed") else "FAILED"
        dropped = f"; disqualified {summary['disqualified']}" if summary.get("disqualified") else ""
        dropped += f"; {NO_INDEPENDENT_ORACLE}" if holdout.get("oracle_used") is False else ""
        lines.append(f"holdout (hidden cases {', '.join(holdout.get('cases') or [])}): "
                     f"attempt {holdout.get('attempt')} {verdict}{dropped}")
    stop = f" ({summary['stop_reason']})" if summary.get("stop_reason") else ""
    lines.append(f"status: {summary.get('status')}{stop}")
    return lines
