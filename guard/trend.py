"""An approval's trend across guard runs: per case, the change since the accepted ratio with its interval,
the threshold band, accepted runs, and a dashed line where the environment changed (labelled with what
changed). SVG written by hand (inlined into the HTML page); PNG drawn from the same points with matplotlib's
Agg canvas, as the report's heatmap is (server/heatmap.py).
"""

from __future__ import annotations

import io
from html import escape
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from guard.history import HistoryRecord

COLOURS = {"pass": "#1a9850", "improved": "#3b7dd8", "regressed": "#d73027", "incorrect": "#7b3294",
           "inconclusive": "#b8860b"}
SERIES = ("#333333", "#3b7dd8", "#e08214", "#1b7837", "#c51b7d", "#542788")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 340, 64, 160, 28, 48


class Point(BaseModel):
    model_config = ConfigDict(frozen=True)

    run: int
    case: str
    verdict: str
    percent: float | None  # the change's estimate, in percent (None: no interval, e.g. incorrect)
    low: float | None = None
    high: float | None = None


class Trend(BaseModel):
    model_config = ConfigDict(frozen=True)

    approval: str
    times: list[str]
    cases: list[str]
    points: list[Point]
    threshold_percent: float
    accepted_runs: list[int]
    environment_marks: list[tuple[int, str]]  # (run index where it changed, the fields that changed)


def trend_of(approval: str, records: list[HistoryRecord]) -> Trend:
    cases, points = [], []
    for run, record in enumerate(records):
        for entry in record.cases:
            if entry.case not in cases:
                cases.append(entry.case)
            change = entry.change
            points.append(Point(run=run, case=entry.case, verdict=entry.verdict,
                                percent=None if change is None else (change.estimate - 1) * 100,
                                low=None if change is None else (change.low - 1) * 100,
                                high=None if change is None else (change.high - 1) * 100))
    marks = []
    for run in range(1, len(records)):
        fields = [d.field for d in records[run - 1].fingerprint.differences(records[run].fingerprint)]
        if fields:
            marks.append((run, ", ".join(fields)))
    threshold = max((c.threshold for r in records for c in r.cases), default=0.015) * 100
    return Trend(approval=approval, times=[r.time for r in records], cases=cases, points=points,
                 threshold_percent=threshold, accepted_runs=[i for i, r in enumerate(records) if r.accepted],
                 environment_marks=marks)


def _y_range(trend: Trend) -> tuple[float, float]:
    values = [v for p in trend.points for v in (p.low, p.high, p.percent) if v is not None]
    span = 2 * trend.threshold_percent
    return min([-span, *values]), max([span, *values])


class _Frame:
    """Maps runs and percents to SVG coordinates."""

    def __init__(self, trend: Trend):
        self.runs = max(1, len(trend.times))
        self.low, self.high = _y_range(trend)

    def x(self, run: float) -> float:
        plot = WIDTH - LEFT - RIGHT
        return LEFT + plot * (run + 0.5) / self.runs

    def y(self, percent: float) -> float:
        plot = HEIGHT - TOP - BOTTOM
        return TOP + plot * (self.high - percent) / (self.high - self.low)


def _svg_axes(trend: Trend, f: _Frame) -> list[str]:
    t = trend.threshold_percent
    parts = [f'<rect x="{LEFT}" y="{f.y(t):.1f}" width="{WIDTH - LEFT - RIGHT}" height="{f.y(-t) - f.y(t):.1f}" '
             'fill="#eef6ee"/>',
             f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{f.y(0):.1f}" y2="{f.y(0):.1f}" stroke="#999"/>',
             f'<text x="{LEFT - 6}" y="{f.y(t) + 4:.1f}" font-size="10" text-anchor="end">+{t:.1f}%</text>',
             f'<text x="{LEFT - 6}" y="{f.y(-t) + 4:.1f}" font-size="10" text-anchor="end">-{t:.1f}%</text>',
             f'<text x="{LEFT - 6}" y="{f.y(0) + 4:.1f}" font-size="10" text-anchor="end">0</text>',
             f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 10}" font-size="11" text-anchor="middle">'
             'guard run (oldest first)</text>',
             f'<text x="{WIDTH / 2}" y="16" font-size="12" text-anchor="middle">{escape(trend.approval)}: change '
             'since accepted (interval; band: the threshold)</text>']
    for run, fields in trend.environment_marks:
        x = f.x(run - 0.5)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#777" '
                     'stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x + 3:.1f}" y="{TOP + 10}" font-size="9" fill="#555">{escape(fields)}</text>')
    for run in trend.accepted_runs:
        parts.append(f'<text x="{f.x(run):.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="9" text-anchor="middle">'
                     'accepted</text>')
    return parts


def trend_svg(trend: Trend) -> str:
    f = _Frame(trend)
    parts = _svg_axes(trend, f)
    for index, case in enumerate(trend.cases):
        colour = SERIES[index % len(SERIES)]
        mine = [p for p in trend.points if p.case == case and p.percent is not None]
        if len(mine) > 1:
            path = " ".join(f"{f.x(p.run):.1f},{f.y(p.percent):.1f}" for p in mine)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1"/>')
        for p in mine:
            parts.append(f'<line x1="{f.x(p.run):.1f}" x2="{f.x(p.run):.1f}" y1="{f.y(p.high):.1f}" '
                         f'y2="{f.y(p.low):.1f}" stroke="{colour}"/>')
            parts.append(f'<circle cx="{f.x(p.run):.1f}" cy="{f.y(p.percent):.1f}" r="4" '
                         f'fill="{COLOURS.get(p.verdict, "#777")}"><title>{escape(case)}: {escape(p.verdict)} '
                         f'{p.percent:+.2f}%</title></circle>')
        for p in (p for p in trend.points if p.case == case and p.percent is None):
            parts.append(f'<text x="{f.x(p.run):.1f}" y="{TOP + 24}" font-size="11" text-anchor="middle" '
                         f'fill="{COLOURS.get(p.verdict, "#777")}">×<title>{escape(case)}: {escape(p.verdict)}'
                         '</title></text>')
        parts.append(f'<text x="{WIDTH - RIGHT + 10}" y="{TOP + 14 * (index + 1)}" font-size="10" '
                     f'fill="{colour}">{escape(case)}</text>')
    body = "".join(parts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" role="img">{body}</svg>')


def trend_png(trend: Trend) -> bytes:
    """The same points drawn with matplotlib (Agg), as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads only when a PNG is drawn
    from matplotlib.figure import Figure  # matplotlib loads only when a PNG is drawn

    figure = Figure(figsize=(7.6, 3.4), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    t = trend.threshold_percent
    axes.axhspan(-t, t, color="#eef6ee")
    axes.axhline(0, color="#999", linewidth=0.8)
    for run, fields in trend.environment_marks:
        axes.axvline(run - 0.5, color="#777", linestyle="--", linewidth=0.8)
        axes.annotate(fields, (run - 0.45, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    for index, case in enumerate(trend.cases):
        mine = [p for p in trend.points if p.case == case and p.percent is not None]
        runs = [p.run for p in mine]
        axes.plot(runs, [p.percent for p in mine], color=SERIES[index % len(SERIES)], linewidth=0.8, label=case)
        axes.errorbar(runs, [p.percent for p in mine], fmt="none", ecolor=SERIES[index % len(SERIES)],
                      yerr=[[p.percent - p.low for p in mine], [p.high - p.percent for p in mine]])
        axes.scatter(runs, [p.percent for p in mine], c=[COLOURS.get(p.verdict, "#777") for p in mine], zorder=3)
    axes.set_ylim(*_y_range(trend))
    axes.set_xlim(-0.5, max(1, len(trend.times)) - 0.5)
    axes.set_xlabel("guard run (oldest first)")
    axes.set_ylabel("change since accepted (%)")
    axes.set_title(f"{trend.approval}: change since accepted (band: the threshold)", fontsize=9)
    if trend.cases:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


class TrendFiles(BaseModel):
    model_config = ConfigDict(frozen=True)

    svg: Path
    png: Path
    svg_text: str  # for inlining into the HTML page without reading the file back


def write_trend(folder: Path, approval: str, records: list[HistoryRecord]) -> TrendFiles:
    """FOLDER/trend-NAME.svg and .png from the approval's history (this run's record included)."""
    trend = trend_of(approval, records)
    folder.mkdir(parents=True, exist_ok=True)
    svg, png = folder / f"trend-{approval}.svg", folder / f"trend-{approval}.png"
    text = trend_svg(trend)
    svg.write_text(text, encoding="utf-8")
    png.write_bytes(trend_png(trend))
    return TrendFiles(svg=svg, png=png, svg_text=text)
