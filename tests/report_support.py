"""Run folders for the report tests: one made here on CPU with the real run logic and the fake executor
(valid, faster, rejected in several ways, disqualified at the holdout, hostile agent text), plus any
real run folder under tests/fixtures/runs/. Each is copied and reported once per test session."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import anyio

from server.report_files import write_report
from tests.server_support import client, kernel, new_run, ok

FIXTURE_RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
RUN_SOURCES = ["cpu"] + sorted(p.name for p in FIXTURE_RUNS.glob("*") if (p / "history.json").is_file())

# Agent-written text that would run if it reached the page unescaped.
HOSTILE = '<script>document.title="PWNED"</script><img src=x onerror="document.title=\'PWNED\'">'
HOSTILE_SOURCE_LINE = '// </pre></details><script>document.title="PWNED"</script>'
HOSTILE_BROKEN = ('extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, '
                  'int m, int n, int k)\n'
                  '{ undefined_thing; /* </pre><script>document.title="PWNED"</script> */ }\n')
USAGE = {"model": "<b>agent-model</b>", "input_tokens": 12000, "output_tokens": 3400, "cost_usd": 0.25}
FINISH_REASON = 'done <script>document.title="PWNED"</script>'

_made: dict[str, Path] = {}


async def _drive(run) -> None:
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="tiles of 32, half the time",
                 usage=USAGE)
        await ok(c, "record_attempt", source=kernel("wrong") + HOSTILE_SOURCE_LINE + "\n", rationale=HOSTILE)
        await ok(c, "record_attempt", source=kernel("latency_us=50", "note: same"), rationale="no change",
                 usage={"input_tokens": 1000})
        await ok(c, "record_attempt", source=HOSTILE_BROKEN, rationale="does not compile")
        await ok(c, "record_attempt", source=kernel("unwritten"), rationale="skips work")
        await ok(c, "record_attempt", source=kernel("latency_us=40", "wrong-holdout"), rationale="fast, wrong on "
                 "shapes it never saw")
        await ok(c, "finish", reason=FINISH_REASON)


def make_cpu_run(folder: Path) -> Path:
    """A finished run of the matmul task: its finish wrote the report already."""
    run = new_run(folder)
    try:
        anyio.run(_drive, run, backend="asyncio")
    finally:
        run.close()
    return run.dir


def reported_run(source: str, tmp_path_factory) -> Path:
    """A run folder (a copy, for a fixture run) holding a freshly written report, once per session."""
    if source not in _made:
        if source == "cpu":
            run_dir = make_cpu_run(tmp_path_factory.mktemp("cpu-run"))
        else:
            run_dir = tmp_path_factory.mktemp("fixture-run") / source
            shutil.copytree(FIXTURE_RUNS / source, run_dir)
            write_report(run_dir)
        _made[source] = run_dir
    return _made[source]


def read_json(path: Path):
    return json.loads(path.read_text())


class Page(HTMLParser):
    """Tags, attributes and visible text of an HTML document (style contents left out)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text_parts: list[str] = []
        self.ids: set[str] = set()
        self._skip = 0
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("style", "title") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text_parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.text_parts).split())

    def tag_names(self) -> set[str]:
        return {name for name, _ in self.tags}
