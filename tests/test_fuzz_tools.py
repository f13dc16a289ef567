"""Fuzzed tool calls through the MCP client: malformed input never crashes the server, never spends the budget,
never writes outside the run folder, and always tells the agent what was wrong.

One run and one client session serve every example of a test (through a blocking portal), so "the session stays
usable" is checked across the whole sequence: describe_task must answer after every fuzzed call.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from server.app import build_server
from server.verify import verify_run
from server.run import Run
from tests.server_support import HOLDOUT, REPO, VISIBLE, kernel, new_run

TOOLS = ("describe_task", "compile_kernel", "run_cases", "validate", "time_kernel", "record_attempt", "finish")
FUZZ = settings(max_examples=60, deadline=None,  # derandomized, no database: the profile in tests/conftest.py
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example, HealthCheck.filter_too_much])
BARE = re.compile(r"Error executing tool [A-Za-z0-9_]*:?\s*")
MAX_MESSAGE_CHARS = 20_000
# What the run may hold: anything else (a traversal, a stray temporary or claim file) is a finding.
RUN_FILES = re.compile(r"(run|lock|history|summary|events-head)\.json|events\.jsonl|best\.cu|best-case-\d+\.json"
                       r"|attempts/\d{3}\.cu|candidates/c[0-9a-f]{15}\.json|compile-logs/c[0-9a-f]{15}\.log"
                       r"|expected/[^/]+/\d+/[a-z_]+\.npy|task/.+|\.serving\.lock|signing\.key")


# -- strategies --------------------------------------------------------------------------------

SPECIAL = ["", " ", "\0", "a\0b", "\ud800", "\u202e", "😀" * 20, "../../etc/passwd", "/etc/passwd", "..",
           "./", "~", "$HOME", "%s%n%x", "{}", "null", "true", "referee://summary.json",
           "c" + "0" * 15, "C0123456789ABCDE", "c0123456789abcdef0", "c0123456789abcd", "c../../../../tmp",
           kernel() + "\0", "é" * 150_000, "x" * 300_000]
hex15 = st.text("0123456789abcdef", min_size=15, max_size=15).map(lambda h: "c" + h)
huge = st.builds(lambda piece, n: piece * n, st.sampled_from(["x", "é", "\0", "😀", "ab\n", "\\", "'"]),
                 st.integers(0, 300_000))
small_text = st.text(max_size=40)
text = st.one_of(small_text, st.sampled_from(SPECIAL), huge, hex15)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(), small_text)
nested = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=10),
                                                      st.dictionaries(small_text, inner, max_size=5)), max_leaves=15)
junk = st.one_of(scalar, text, nested)

GEOMETRY = [0, -1, 1, 32, 1024, 2 ** 31, 2 ** 40, 2 ** 80, -(2 ** 63), "0", "-1", "1", '__import__("os")', "a.b",
            "9**9**9", "(2**64)**64", "((9**64)**64)**64", "ceil_div(n, 0)", "ceil_div(n, 32)", "ceil_div(m, 8)",
            "n", "m", "k", "q", "", " ", "1/0", "n//0", "n % 0", "n / 3", "2**64", "x" * 600, "(" * 40 + "1" + ")" * 40,
            "min()", "max(1)", "min(n, 0)", "lambda: 1", "[1][0]", "n if n else 1", "1e9", "1e999", "0x10", "True",
            "None", "open('/etc/passwd')", "n.__class__", "ceil_div(n, k=1)", "max(*[1])", "\0", "é", "n\0"]
typed_entry = st.one_of(st.sampled_from([g for g in GEOMETRY if type(g) in (int, str)]), st.integers(),
                        small_text)
entry = st.one_of(typed_entry, st.floats(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
# Mostly shapes the schema accepts (1 to 3 entries of int or str), so that the referee's own checks are reached.
dims = st.one_of(st.lists(typed_entry, min_size=1, max_size=3), st.lists(typed_entry, min_size=1, max_size=3),
                 st.lists(entry, max_size=10))
case_names = st.sampled_from(VISIBLE + [HOLDOUT, "nope", "", "\0", "../../etc/passwd", "x" * 200])
shared = st.one_of(typed_entry, entry)
geometry = st.fixed_dictionaries({"grid": dims, "block": dims}, optional={"shared_bytes": shared})
launch = st.one_of(
    geometry, geometry,
    st.fixed_dictionaries({"grid": dims, "block": dims, "per_case": st.dictionaries(case_names, geometry, max_size=4)},
                          optional={"shared_bytes": shared}),
    st.fixed_dictionaries({"grid": dims, "block": dims}, optional={
        "shared_bytes": shared, "junk": junk,
        "per_case": st.one_of(st.dictionaries(case_names, st.one_of(geometry, junk), max_size=4), junk)}),
    junk)
OPTION_WORDS = ["-rdc=true", "-rdc", "--relocatable-device-code=true", "-I/etc", "-I", "--include-path=/",
                "-include", "/etc/passwd", "--pre-include=/etc/passwd", "-o", "/tmp/x", "--output=/tmp/x",
                "-maxrregcount=0", "-maxrregcount=9999", "-maxrregcount=-1", "-D", "-D=1", "-D\0", "-DX=\0",
                "--use_fast_math", "-std=c++99", "-arch=sm_1", "--gpu-architecture=compute_10", "-G", "-E", "",
                "x" * 10_000, "x" * 199, "-lineinfo " * 30]
options = st.one_of(st.lists(st.one_of(st.sampled_from(OPTION_WORDS), small_text), max_size=40), junk)
cases = st.one_of(st.lists(st.one_of(case_names, small_text), max_size=70), junk)
usage = st.one_of(st.dictionaries(st.one_of(st.sampled_from(["model", "calls", "input_tokens", "output_tokens",
                                                             "cost_usd"]), small_text), junk, max_size=8), junk)
candidate_ids = st.one_of(hex15, st.sampled_from(SPECIAL), small_text, junk)
VALUES = {"source": st.one_of(st.just(kernel()), text, junk), "candidate_id": candidate_ids, "launch": launch,
          "cases": cases, "options": options, "rationale": st.one_of(text, junk), "usage": usage,
          "reason": st.one_of(text, junk)}
NAMES = list(VALUES) + ["candidate", "source_file", "attempt", "", "\0", "__class__"]


def fields(names):
    return st.sets(st.sampled_from(names), max_size=6).flatmap(
        lambda keys: st.fixed_dictionaries({k: VALUES.get(k, junk) for k in keys}))


def _drop(*names):
    return lambda args: {k: v for k, v in args.items() if k not in names}


def _set(**values):
    return lambda args: {**args, **values}


def _bad_rationale(value):
    return lambda args: {**args, "rationale": value}


# Each of these alone makes a record_attempt call invalid: a fuzzed record_attempt must never spend the budget.
ATTEMPT_DEFECTS = st.one_of(
    st.just(_drop("rationale")),
    st.sampled_from([None, 0, 1.5, True, [], {}, ["r"], {"r": 1}, "", "x" * 4001, "x" * 300_000]).map(_bad_rationale),
    st.just(lambda args: {**args, "candidate_id": "c0123456789abcde", "source": kernel()}),
    st.just(_drop("candidate_id", "source")),
    st.one_of(hex15, st.sampled_from(["../../etc/passwd", "c" + "0" * 64, "", "\0", "c0123456789ABCDE"]))
    .map(lambda cid: lambda args: {**_drop("source")(args), "candidate_id": cid}),
    st.sampled_from([kernel() + "\0", "x" * 262_145, "é" * 150_000, 7, ["x"], {"s": 1}])
    .map(lambda source: lambda args: {**_drop("candidate_id")(args), "source": source}),
    st.sampled_from([{"grid": [0], "block": [1]}, {"grid": ["ceil_div(n, 0)"], "block": [1]}, {"grid": [1]},
                     {"grid": [1], "block": [2 ** 40]}, {"grid": ["__import__('os')"], "block": [32]}, "grid",
                     {"grid": [1] * 10, "block": [1]}]).map(lambda bad: _set(launch=bad)),
    st.sampled_from([{"calls": -1}, {"input_tokens": "many"}, {"model": "m" * 201}, {"cost_usd": -0.5}, "lots",
                     [1, 2], 5]).map(lambda bad: _set(usage=bad)),
)
ATTEMPT_BASE = st.fixed_dictionaries({"rationale": st.sampled_from(["faster", "r", "é" * 100])}, optional={
    "source": st.just(kernel("latency_us=50")), "launch": st.just({"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"],
                                                                    "block": [16, 16]}),
    "usage": st.just({"model": "m", "calls": 3, "extra": {"nested": [1, None]}})})
BAD_REASON = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(small_text, max_size=3),
                       st.dictionaries(small_text, small_text, max_size=3), st.just(""),
                       st.integers(1001, 300_000).map(lambda n: "r" * n))


@st.composite
def invalid_attempt(draw, base=ATTEMPT_BASE):
    args = draw(base)
    if "source" not in args and draw(st.booleans()):
        args["candidate_id"] = "known"  # replaced with the id of a compiled candidate at call time
    for defect in draw(st.lists(ATTEMPT_DEFECTS, min_size=1, max_size=3)):
        args = defect(args)
    return args


@st.composite
def invalid_finish(draw):
    args = draw(fields(NAMES))
    reason = draw(st.one_of(st.just(None), BAD_REASON))
    args.pop("reason", None)
    if reason is not None:
        args["reason"] = reason
    return args


@st.composite
def any_call(draw):
    """A tool (or an unknown name) with arbitrary arguments; record_attempt and finish made invalid."""
    name = draw(st.one_of(st.sampled_from(TOOLS), st.sampled_from(["", "nope", "describe_task ", "../finish"])))
    if name == "record_attempt":
        args = draw(fields(NAMES))
        for defect in draw(st.lists(ATTEMPT_DEFECTS, min_size=1, max_size=2)):
            args = defect(args)
        return name, args
    if name == "finish":
        return name, draw(invalid_finish())
    return name, draw(fields(NAMES))


# -- the served run ------------------------------------------------------------------------------

@dataclass
class Served:
    run: Run
    portal: BlockingPortal
    client: Client
    known: str

    def call(self, name: str, args: dict[str, Any]):
        try:
            return self.portal.call(self.client.call_tool, name, args)
        except Exception as exc:  # noqa: BLE001 - any exception escaping a tool call is a finding
            raise AssertionError(f"{name}({_short(args)}) raised {type(exc).__name__}: {exc}") from exc

    def fuzz(self, name: str, args: dict[str, Any], *, must_fail: bool = False) -> None:
        args = {k: (self.known if v == "known" and k == "candidate_id" else v) for k, v in args.items()}
        before = self.run.attempts_used
        result = self.call(name, args)
        if must_fail:
            assert result.is_error, f"{name}({_short(args)}) was accepted"
        if result.is_error:
            assert result.content and result.content[0].type == "text", result.content
            message = result.content[0].text
            assert message.strip(), f"{name}({_short(args)}): an empty error message"
            assert not BARE.fullmatch(message), f"{name}({_short(args)}): a bare error {message!r}"
            assert len(message) <= MAX_MESSAGE_CHARS, f"{name}({_short(args)}): a {len(message)}-character message"
        answer = self.call("describe_task", {})
        assert not answer.is_error, answer.content[0].text
        budget = answer.structured_content["budget"]
        assert (budget["attempts_used"], budget["finished"]) == (before, False), (name, _short(args))
        assert self.run.attempts_used == before
        assert [e.attempt for e in self.run.history] == [0]


def _short(args: dict) -> str:
    return repr({k: (f"<{type(v).__name__} of {len(v)}>" if isinstance(v, (str, list, dict)) and len(repr(v)) > 200
                     else v) for k, v in args.items()})[:1000]


def _outside_files(roots: list[Path], skip: Path) -> set[str]:
    seen = set()
    for root in roots:
        for path in root.rglob("*"):
            if skip not in path.parents and path != skip:
                seen.add(str(path))
    return seen


REFEREE_WRITES = re.compile(r"(^|/)(\d{3}\.(cu|claim)|best\.cu|best-case-\d+\.json|c[0-9a-f]{15}\.(json|log)"
                            r"|(run|lock|history|summary|events-head)\.json|events\.jsonl.*|[^/]*\.npy|\.[^/]*\.tmp)$")


def _git_status() -> set[str]:
    """What git sees that the referee could have written (other people edit source files meanwhile): files named
    like a run's, anything in the shipped task, and a results/ folder in the repository."""
    # --no-optional-locks: a read that never refreshes the index. results/ is ignored by git: listed by hand.
    out = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=all"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    seen = {line for line in out.splitlines() if line[3:].startswith("cases/") or REFEREE_WRITES.search(line[3:])}
    return seen | {f"results: {p.relative_to(REPO)}" for p in (REPO / "results").rglob("*")}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    results = tmp_path_factory.mktemp("fuzz")
    run = new_run(results, compiles_per_minute=1_000_000, probes_per_window=1_000_000,
                  probe_gpu_seconds_per_window=1e9)
    with start_blocking_portal(backend="asyncio") as portal:
        with portal.wrap_async_context_manager(Client(build_server(run), cache=None)) as client:
            known = portal.call(client.call_tool, "compile_kernel", {"source": kernel("latency_us=50")})
            assert not known.is_error
            yield Served(run, portal, client, known.structured_content["candidate"])
    run.close()


@pytest.fixture
def contained(served, tmp_path_factory):
    """Nothing written outside the run folder during the test; the run folder holds only what it should."""
    roots = [tmp_path_factory.getbasetemp()]
    files, status = _outside_files(roots, served.run.dir), _git_status()
    yield served
    assert _outside_files(roots, served.run.dir) == files
    assert _git_status() - status == set()
    strays = [p.relative_to(served.run.dir).as_posix() for p in served.run.dir.rglob("*") if p.is_file()]
    assert [p for p in strays if not RUN_FILES.fullmatch(p)] == []
    report = verify_run(served.run.dir)
    assert report.ok, report.problems


# -- the properties ------------------------------------------------------------------------------

def test_any_tool_with_arbitrary_arguments(contained):
    @FUZZ
    @given(any_call())
    def check(call):
        contained.fuzz(*call)

    check()


def test_absurd_launch_geometry(contained):
    @FUZZ
    @given(st.sampled_from(["compile_kernel", "run_cases", "validate", "time_kernel"]), launch,
           st.booleans())
    def check(tool, geometry, by_id):
        args = {"candidate_id": contained.known} if by_id and tool != "compile_kernel" else {"source": kernel()}
        contained.fuzz(tool, {**args, "launch": geometry})

    check()


def test_ids_cases_and_options(contained):
    @FUZZ
    @given(st.one_of(
        st.tuples(st.sampled_from(["run_cases", "validate", "time_kernel"]),
                  st.fixed_dictionaries({"candidate_id": candidate_ids})),
        st.tuples(st.sampled_from(["run_cases", "time_kernel"]),
                  st.fixed_dictionaries({"candidate_id": st.just("known"), "cases": cases})),
        st.tuples(st.just("compile_kernel"), st.fixed_dictionaries({"source": st.just(kernel()), "options": options})),
        st.tuples(st.just("compile_kernel"), st.fixed_dictionaries({"source": text}))))
    def check(call):
        contained.fuzz(*call)

    check()


def test_invalid_record_attempt_and_finish_spend_nothing(contained):
    @FUZZ
    @given(st.one_of(st.tuples(st.just("record_attempt"), invalid_attempt()),
                     st.tuples(st.just("finish"), invalid_finish())))
    def check(call):
        contained.fuzz(*call, must_fail=True)

    check()
    assert sorted(p.name for p in (contained.run.dir / "attempts").iterdir()) == ["000.cu"]
