"""The rooms' import rules, read from the source: bench -> service -> guard -> server -> harness -> sandbox, one way.

harness/worker_side/ is the code that runs inside the confined workers: it imports nothing else of
the project's parent side (no task models, no settings), only sandbox/ and itself. An import inside
a function is allowed only with its reason on the same line, and an import of the project's own
modules inside a function only in a worker's entry point, which must confine itself before it loads
CUDA.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("bench", "service", "guard", "server", "harness", "sandbox")  # each may import only the rooms after it
WORKER_SIDE = "harness.worker_side"
WORKER_ENTRY_POINTS = ("harness/worker_side/gpu_worker_main.py", "harness/worker_side/compile_worker_main.py")
# The script's entry point imports the command line inside a function, so that Ctrl-C during that import is caught.
# It is the house's door: it may import a room before its own there (the guard's commands: server/entry.py), the
# one place an import runs against the rooms' order; the reason stands on the import's line.
SCRIPT_ENTRY_POINTS = ("server/entry.py",)
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for room in ROOMS for p in (REPO / room).rglob("*.py"))


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _imports(tree: ast.AST, module: str) -> list[tuple[ast.stmt, str, bool]]:
    """(node, imported module, inside a function) for every import of the file."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((child, alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    package = module.split(".")[:-child.level]
                    base = ".".join(package + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in child.names] if base in _packages() else [base]
                found.extend((child, name, in_function) for name in names)
            visit(child, nested)

    visit(tree, False)
    return found


def _packages() -> set[str]:
    return set(ROOMS) | {WORKER_SIDE}


def _room(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in ROOMS else None


def _all_imports():
    for path in _sources():
        module = _module_of(path)
        tree = ast.parse(path.read_text(), str(path))
        for node, name, in_function in _imports(tree, module):
            yield path, module, node, name, in_function


def test_imports_run_one_way():
    wrong = []
    for path, module, node, name, in_function in _all_imports():
        mine, theirs = _room(module), _room(name)
        if theirs is not None and ROOMS.index(theirs) < ROOMS.index(mine):
            if in_function and str(path.relative_to(REPO)) in SCRIPT_ENTRY_POINTS:
                continue  # the door dispatches to a product's commands (the reason is checked below)
            wrong.append(f"{path.relative_to(REPO)}:{node.lineno} ({mine}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_worker_side_imports_nothing_parent_side():
    wrong = []
    for path, module, node, name, _ in _all_imports():
        if not module.startswith(WORKER_SIDE):
            continue
        if _room(name) in ("harness", "server", "bench") and not name.startswith(WORKER_SIDE):
            wrong.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_say_why_and_load_no_project_module_outside_a_worker_entry_point():
    wrong = []
    for path, _, node, name, in_function in _all_imports():
        if not in_function:
            continue
        where = f"{path.relative_to(REPO)}:{node.lineno}"
        line = path.read_text().splitlines()[node.lineno - 1]
        if "#" not in line:
            wrong.append(f"{where}: the import of {name} inside a function gives no reason")
        if _room(name) and str(path.relative_to(REPO)) not in WORKER_ENTRY_POINTS + SCRIPT_ENTRY_POINTS:
            wrong.append(f"{where}: the project's module {name} is imported inside a function")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_files_and_functions_stay_small(path: Path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{len(text.splitlines())} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, ", ".join(long)


def test_the_rules_see_a_violation():
    """The checks read real import statements: a planted wrong-way import is caught."""
    tree = ast.parse("def f():\n    from server import app\nfrom harness import task\n")
    found = {(name, in_function) for _, name, in_function in _imports(tree, "sandbox.pool")}
    assert found == {("server.app", True), ("harness.task", False)}
