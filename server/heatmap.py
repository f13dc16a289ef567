"""The latency heatmap of a run: performance cases x attempts, colour = median latency / baseline median.

Green is faster than the baseline, red slower, on a log scale from 1/4x to 4x; rejected attempts are
grey and hatched, whatever they measured. The SVG is written by hand (self-contained, deterministic,
inlined into report.html); the PNG is drawn with matplotlib's Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from html import escape

from server.report import RunReport

LIMIT = 4.0  # the colour saturates at 1/LIMIT x and LIMIT x the baseline's latency
FASTER, NEUTRAL, SLOWER = (26, 152, 80), (247, 247, 247), (215, 48, 39)
REJECTED_GREY, UNTIMED_GREY = (189, 189, 189), (236, 236, 236)
TITLE = "median latency relative to the baseline (lower is faster)"


@dataclass(frozen=True)
class Cell:
    relative: float | None  # median latency / baseline median; None when there is none
    state: str  # "timed", "rejected" or "not timed"

    @property
    def label(self) -> str:
        if self.state == "rejected":
            return "rejected"
        return "—" if self.relative is None else f"{self.relative:.2f}×"


@dataclass(frozen=True)
class Heatmap:
    cases: list[str]
    columns: list[str]  # one label per attempt
    cells: list[list[Cell]]  # [case][attempt]


def heatmap_of(report: RunReport) -> Heatmap:
    columns, by_attempt = [], []
    for attempt in report.attempts:
        label = "0 baseline" if attempt.number == 0 else str(attempt.number)
        if attempt.disqualified:
            label += " DQ"
        elif attempt.is_best and attempt.number != 0:
            label += " best"
        columns.append(label)
        by_attempt.append({c.case: c.relative_to_baseline for c in attempt.cases})
    cells = [[Cell(None, "rejected") if a.rejected else
              Cell(rel, "not timed") if (rel := by_attempt[i].get(case)) is None else Cell(rel, "timed")
              for i, a in enumerate(report.attempts)] for case in report.performance_cases]
    return Heatmap(list(report.performance_cases), columns, cells)


def colour(relative: float) -> tuple[int, int, int]:
    t = max(-1.0, min(1.0, math.log(max(relative, 1e-12)) / math.log(LIMIT)))
    end = FASTER if t < 0 else SLOWER
    return tuple(round(n + (e - n) * abs(t)) for n, e in zip(NEUTRAL, end))


def cell_colour(cell: Cell) -> tuple[int, int, int]:
    if cell.state == "rejected":
        return REJECTED_GREY
    return UNTIMED_GREY if cell.relative is None else colour(cell.relative)


def _dark(rgb: tuple[int, int, int]) -> bool:
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 120


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


# -- SVG --------------------------------------------------------------------------------------

CELL_W, CELL_H, FONT = 78, 30, 12


def heatmap_svg(heatmap: Heatmap) -> str:
    left = 16 + 7 * max([len(c) for c in heatmap.cases] + [10])
    top, columns = 58, max(1, len(heatmap.columns))
    width = max(left + CELL_W * columns + 16, 460)
    height = top + CELL_H * max(1, len(heatmap.cases)) + 78
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{FONT}" role="img" '
             f'aria-label="{escape(TITLE)}">',
             '<defs><pattern id="hm-hatch" width="8" height="8" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="8" stroke="#8a8a8a" stroke-width="2"/>'
             '</pattern>' + _gradient() + '</defs>',
             f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="8" y="18" font-size="14" font-weight="bold">{escape(TITLE)}</text>',
             f'<text x="{left - 8}" y="{top - 10}" text-anchor="end" fill="#555">case \\ attempt</text>']
    for j, label in enumerate(heatmap.columns):
        parts.append(f'<text x="{left + CELL_W * j + CELL_W / 2}" y="{top - 10}" text-anchor="middle" '
                     f'font-weight="bold">{escape(label)}</text>')
    for i, case in enumerate(heatmap.cases):
        y = top + CELL_H * i
        parts.append(f'<text x="{left - 8}" y="{y + CELL_H / 2 + FONT / 3}" text-anchor="end">{escape(case)}</text>')
        for j, cell in enumerate(heatmap.cells[i]):
            parts.append(_svg_cell(left + CELL_W * j, y, cell))
    if not heatmap.cases:
        parts.append(f'<text x="{left}" y="{top + 20}" fill="#555">no timed performance cases</text>')
    parts.append(_svg_legend(left, top + CELL_H * max(1, len(heatmap.cases)) + 24))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _gradient() -> str:
    stops = []
    for k in range(9):
        relative = LIMIT ** (k / 4 - 1)
        stops.append(f'<stop offset="{k / 8:.3f}" stop-color="{_hex(colour(relative))}"/>')
    return '<linearGradient id="hm-scale" x1="0" x2="1" y1="0" y2="0">' + "".join(stops) + "</linearGradient>"


def _svg_cell(x: float, y: float, cell: Cell) -> str:
    rgb = cell_colour(cell)
    title = escape(f"{cell.state}: {cell.label}")
    rect = (f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{_hex(rgb)}" stroke="#ffffff" '
            f'stroke-width="2"><title>{title}</title></rect>')
    if cell.state == "rejected":
        rect += f'<rect x="{x + 1}" y="{y + 1}" width="{CELL_W - 2}" height="{CELL_H - 2}" fill="url(#hm-hatch)"/>'
    text_fill = "#ffffff" if _dark(rgb) else "#1a1a1a"
    return rect + (f'<text x="{x + CELL_W / 2}" y="{y + CELL_H / 2 + FONT / 3}" text-anchor="middle" '
                   f'fill="{text_fill}">{escape(cell.label)}</text>')


def _svg_legend(x: float, y: float) -> str:
    bar = 240
    parts = [f'<rect x="{x}" y="{y}" width="{bar}" height="12" fill="url(#hm-scale)" stroke="#999"/>']
    for k, text in enumerate(("≤0.25×", "0.5×", "1×", "2×", "≥4×")):
        parts.append(f'<text x="{x + bar * k / 4}" y="{y + 28}" text-anchor="middle" font-size="11">{text}</text>')
    parts.append(f'<rect x="{x + bar + 24}" y="{y}" width="24" height="12" fill="{_hex(REJECTED_GREY)}"/>'
                 f'<rect x="{x + bar + 24}" y="{y}" width="24" height="12" fill="url(#hm-hatch)"/>'
                 f'<text x="{x + bar + 54}" y="{y + 11}" font-size="11">rejected</text>')
    parts.append(f'<text x="{x}" y="{y + 44}" font-size="11" fill="#555">faster than the baseline: green; '
                 'slower: red; DQ: disqualified at the holdout</text>')
    return "".join(parts)


# -- PNG --------------------------------------------------------------------------------------

def heatmap_png(heatmap: Heatmap) -> bytes:
    """The same heatmap drawn with matplotlib (Agg), as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads only when a PNG is drawn
    from matplotlib.colors import LinearSegmentedColormap, LogNorm  # matplotlib loads only when a PNG is drawn
    from matplotlib.figure import Figure  # matplotlib loads only when a PNG is drawn
    from matplotlib.patches import Rectangle  # matplotlib loads only when a PNG is drawn

    rows, columns = max(1, len(heatmap.cases)), max(1, len(heatmap.columns))
    figure = Figure(figsize=(2.6 + 0.95 * columns, 1.9 + 0.45 * rows), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = [[tuple(v / 255 for v in cell_colour(c)) for c in row] for row in heatmap.cells] or [[(1, 1, 1)]]
    axes.imshow(image, aspect="auto", interpolation="nearest")
    for i, row in enumerate(heatmap.cells):
        for j, cell in enumerate(row):
            if cell.state == "rejected":
                axes.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#8a8a8a",
                                         linewidth=0))
            axes.text(j, i, cell.label, ha="center", va="center", fontsize=8,
                      color="white" if _dark(cell_colour(cell)) else "#1a1a1a")
    axes.set_xticks(range(len(heatmap.columns)), labels=heatmap.columns, fontsize=8)
    axes.set_yticks(range(len(heatmap.cases)), labels=heatmap.cases, fontsize=8)
    axes.set_xlabel("attempt")
    axes.set_title(TITLE, fontsize=9)
    scale = LinearSegmentedColormap.from_list("referee", [tuple(v / 255 for v in colour(LIMIT ** (k / 4 - 1)))
                                                          for k in range(9)])
    mappable = axes.figure.colorbar(_mappable(scale, LogNorm(1 / LIMIT, LIMIT)), ax=axes, shrink=0.9)
    mappable.set_ticks([0.25, 0.5, 1, 2, 4], labels=["0.25×", "0.5×", "1×", "2×", "4×"])
    mappable.minorticks_off()
    mappable.set_label("latency / baseline", fontsize=8)
    if not heatmap.cases:
        axes.text(0, 0, "no timed performance cases", ha="center", va="center")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _mappable(cmap, norm):
    from matplotlib.cm import ScalarMappable  # matplotlib loads only when a PNG is drawn

    return ScalarMappable(norm=norm, cmap=cmap)
