"""report.html in headless Chromium: what a person sees (the rendered DOM's text, a screenshot that is not
blank, the heatmap's colours on screen) and that no script from hostile agent text ran.

Skipped, with the reason, where Chromium is not installed (`apt-get install chromium`; .ci/run tries).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from server.heatmap import REJECTED_GREY, colour
from tests.report_support import FINISH_REASON, HOSTILE, RUN_SOURCES, Page, read_json, reported_run

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                "(apt-get install -y chromium)")
WIDTH, HEIGHT = 1280, 3000


def chromium(tmp_path: Path, page: Path, *mode: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *mode,
               page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def near(counts: list[tuple[int, tuple]], rgb: tuple[int, int, int], tolerance: int = 4) -> int:
    """Pixels of the screenshot within `tolerance` of a colour in every channel."""
    return sum(n for n, c in counts if all(abs(a - b) <= tolerance for a, b in zip(c, rgb)))


@pytest.fixture(params=RUN_SOURCES)
def run_dir(request, tmp_path_factory):
    return reported_run(request.param, tmp_path_factory)


@pytest.fixture
def rendered(run_dir, tmp_path):
    """(the DOM after loading, as Chromium serializes it; the screenshot's path)."""
    dom = chromium(tmp_path, run_dir / "report.html", "--dump-dom")
    assert dom.returncode == 0 and "<html" in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, run_dir / "report.html", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    return dom.stdout, shot


def test_a_person_sees_the_run_its_attempts_and_the_commands(run_dir, rendered):
    dom, _ = rendered
    page = Page(dom)
    summary = read_json(run_dir / "summary.json")
    history = read_json(run_dir / "history.json")["attempts"]
    expected = [f"kernel-referee report: {summary['task']}, {summary['run']}", "Best: attempt", "Latency heatmap",
                "Rejections by kind", "Cost sheet", "Kernel latency is not the end-to-end saving",
                f"kernel-referee replay {run_dir}", f"kernel-referee verify {run_dir}",
                f"Stop reason: {summary.get('stop_reason') or '—'}"]
    expected += [f"Attempt {e['attempt']} {e['verdict']}" for e in history]
    for text in expected:
        assert " ".join(text.split()) in page.text, text
    assert {f"attempt-{e['attempt']}" for e in history} <= page.ids
    assert "svg" in page.tag_names()  # the heatmap is drawn inline


def test_the_screenshot_shows_a_page_and_the_heatmap(rendered):
    from PIL import Image, ImageStat

    _, shot = rendered
    with Image.open(shot) as image:
        assert image.size == (WIDTH, HEIGHT)
        rgb = image.convert("RGB")
        variance = ImageStat.Stat(rgb.convert("L")).var[0]
        assert variance > 100, f"the screenshot looks blank (pixel variance {variance:.1f})"
        colours = {c for _, c in rgb.getcolors(maxcolors=WIDTH * HEIGHT)}
    assert colour(1.0) in colours  # the baseline's own cells, 1.00x, drawn in the heatmap


def test_the_cpu_run_heatmap_shows_faster_and_rejected_cells(tmp_path_factory, tmp_path):
    from PIL import Image

    run_dir = reported_run("cpu", tmp_path_factory)
    shot = tmp_path / "report.png"
    assert chromium(tmp_path, run_dir / "report.html", f"--screenshot={shot}").returncode == 0
    with Image.open(shot) as image:
        counts = image.convert("RGB").getcolors(maxcolors=WIDTH * HEIGHT)
    assert near(counts, colour(0.5)) > 4 * 1500  # attempts 1 and 3 on two cases: half the baseline's latency
    assert near(counts, REJECTED_GREY) > 6 * 500  # attempts 2, 4 and 5, hatched


def test_no_script_from_hostile_agent_text_ran(tmp_path_factory, tmp_path):
    run_dir = reported_run("cpu", tmp_path_factory)
    dom = chromium(tmp_path, run_dir / "report.html", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page(dom.stdout)
    title = dom.stdout.split("<title>", 1)[1].split("</title>", 1)[0]
    assert "PWNED" not in title and title.startswith("kernel-referee report")
    assert not page.tag_names() & {"script", "img", "iframe"}
    assert not any(a.startswith("on") for _, attributes in page.tags for a in attributes)
    assert HOSTILE in page.text and " ".join(FINISH_REASON.split()) in page.text  # shown as text, not run
