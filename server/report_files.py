"""Writing report.html, heatmap.svg and heatmap.png into a run folder: derived files, not in the audit log,
listed with their sha256 in derived.json, signed with the run's key (server/signed_log.py).

A finished run's report is written after the call that finished it has answered (server/app.py), or by
`kernel-referee report RUN` (`write_report_held`, which holds the run folder as a server does); rendering
never runs inside an MCP tool call. A run that ended in this process has its report due until it is written
(`write_end_report`): the audit service shows a run finished only once it is.
"""

from __future__ import annotations

import logging
from pathlib import Path

from server.audit import write_bytes_atomic
from server.cost import CostInputs
from server.folder_lock import FolderLock
from server import heatmap
from server.report import load_report
from server.report_html import render_report
from server import keys
from server.signed_log import DERIVED_NAMES, derived_difference, sign_derived

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"


def write_report(run_dir: Path, cost_inputs: CostInputs | None = None) -> list[Path]:
    """report.html, heatmap.svg and heatmap.png in the run folder, listed in its signed derived.json; returns
    their paths. Raises keys.SigningKeyError where the run's key cannot be read here (the files are written)."""
    run_dir = Path(run_dir)
    report = load_report(run_dir, cost_inputs)
    cells = heatmap.heatmap_of(report)
    svg = heatmap.heatmap_svg(cells)
    written = []
    for name, data in (("heatmap.svg", svg.encode()), ("heatmap.png", heatmap.heatmap_png(cells)),
                       (REPORT_NAME, render_report(report, svg).encode())):
        write_bytes_atomic(run_dir / name, data)
        written.append(run_dir / name)
    sign_derived(run_dir)
    return written


def write_report_held(run_dir: Path, cost_inputs: CostInputs | None = None) -> list[Path]:
    """`write_report` for `kernel-referee report`: the run folder held while it is read and written
    (server/folder_lock.py; FolderHeld when a server or a replay holds it)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():  # nothing to hold: write_report says what is missing
        return write_report(run_dir, cost_inputs)
    with FolderLock.take(run_dir, "report"):
        return write_report(run_dir, cost_inputs)


def write_end_report(run) -> None:
    """The report of a run that ended in this process (server/run.py `Run`, whose `report_due` finish set), written
    once by whoever needs it first: the server after the call that ended the run answered, the audit service
    before it shows the run finished. The run's mutex is held, so the folder's files stay as they are while they
    are read; a failure is logged and the report is no longer due (`kernel-referee report RUN` writes it again)."""
    with run.exclusive():
        _write_due(run)


def end_report_whole(run) -> bool:
    """`write_end_report`, then whether the report stands whole (`report_whole`), under one hold of the run's mutex:
    no replay or report written meanwhile is read half done."""
    with run.exclusive():
        _write_due(run)
        return report_whole(run.dir, run.key)


def report_whole(run_dir: Path, key: keys.RunKey | None) -> bool:
    """report.html there, and no report file missing or changed against derived.json: what a run shown finished
    by the audit service holds."""
    return (run_dir / REPORT_NAME).is_file() and not report_cut_short(run_dir, key)


def _write_due(run) -> None:
    if not run.report_due:
        return
    try:
        write_report_files(run.dir)
    finally:
        run.report_due = False


def report_cut_short(run_dir: Path, key: keys.RunKey | None) -> bool:
    """Whether a finished run's report was left unwritten or half written (a stop between the run's end and the
    report's signature): report.html missing, or a report file derived.json does not list as it is. Where a
    replay's file disagrees with derived.json, or derived.json's signature does not verify, the folder is left as
    it is for `verify` to name: writing the report signs every derived file there."""
    if key is None:  # a run made before signing: no derived.json holds its report
        return not (run_dir / REPORT_NAME).is_file()
    difference = derived_difference(run_dir, key.public_hex)
    if (difference.listed and not difference.signed) or any(name not in DERIVED_NAMES for name in difference.names):
        return False
    return bool(difference.names) or not (run_dir / REPORT_NAME).is_file()


def write_report_files(run_dir: Path) -> None:
    """`write_report` for the end of a run: a failure is logged, never raised (the run's result stands)."""
    try:
        write_report(run_dir)
    except Exception:  # noqa: BLE001 - derived artefacts; `kernel-referee report RUN` can write them again
        log.warning("the report of %s could not be written", run_dir, exc_info=True)
