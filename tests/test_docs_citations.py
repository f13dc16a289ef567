"""Every test the documentation cites exists: a file under tests/ by its path, a test by `path::name`. A row of
docs/security.md that names a test nobody can run promises a guard nobody checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
CITED = re.compile(r"\b(tests/[\w/]+\.py)(?:::(\w+))?")


def citations() -> list[tuple[str, str, str | None]]:
    found = []
    for doc in DOCS:
        for path, name in CITED.findall(doc.read_text(encoding="utf-8")):
            found.append((doc.name, path, name or None))
    return sorted(set(found), key=lambda c: (c[0], c[1], c[2] or ""))


def test_the_docs_cite_tests():
    assert any(doc == "security.md" and name for doc, _, name in citations())


@pytest.mark.parametrize("doc, path, name", citations())
def test_each_cited_test_exists(doc, path, name):
    file = REPO / path
    assert file.is_file(), f"{doc} cites {path}, which does not exist"
    if name is not None:
        assert re.search(rf"^(async )?def {name}\(|^class {name}\b", file.read_text(encoding="utf-8"), re.M), \
            f"{doc} cites {path}::{name}, which {path} does not define"


def test_the_map_names_every_bench_script():
    """docs/architecture.md is the newcomer's map: a measurement it does not name is one nobody finds."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    unnamed = [p.name for p in sorted((REPO / "bench").glob("*.py")) if p.name != "__init__.py"
               and f"`{p.name}`" not in text]
    assert unnamed == []
