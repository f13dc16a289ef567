"""profile_kernel (issue 22, item 1) over the fake executor: off unless served with --profile, a probe with its
own GPU-time cap, refused for an invalid candidate, one line where ncu or its counters are missing, the full
report kept in the run folder and readable as referee://profiles/{id}."""

from __future__ import annotations

import pytest

from harness.profile_digest import METRICS
from server.cli import _parser, settings_of
from server import demo
from server.lifecycle import resume_run
from server.report import load_report
from server.report_html import render_report
from tests.server_support import client, events, executor, kernel, new_run, ok, refused


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_profiling_is_off_by_default_and_says_so_in_one_line(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        assert (await ok(c, "describe_task"))["profiling"] is False
        message = await refused(c, "profile_kernel", source=kernel("v1"))
        assert message.startswith("profiling is off for this run") and "\n" not in message
        assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 20  # nothing charged
    assert run.executor.profiled == []
    run.close()


def test_serve_profile_turns_it_on_and_the_default_leaves_it_off():
    parser = _parser()
    assert settings_of(parser.parse_args(["serve", "--task", "t", "--profile"])).run.profile is True
    assert settings_of(parser.parse_args(["serve", "--task", "t"])).run.profile is False


@pytest.mark.anyio
async def test_a_profile_is_a_charged_probe_with_a_digest_and_its_report_is_a_resource(tmp_path):
    run = new_run(tmp_path, profile=True)
    async with client(run) as c:
        assert (await ok(c, "describe_task"))["profiling"] is True
        answer = await ok(c, "profile_kernel", source=kernel("blocked"), case="rect-2000x1500x1000")
        assert (answer["case"], answer["profile"], answer["resource"]) == (
            "rect-2000x1500x1000", "p001", "referee://profiles/p001")
        assert answer["digest"]["occupancy"]["limited_by"] == ["registers"]
        assert answer["digest"]["duration_ms"] == pytest.approx(0.86835)
        assert answer["budget"]["probes_left_in_window"] == 19
        second = await ok(c, "profile_kernel", candidate_id=answer["candidate"])  # default: the first performance case
        assert (second["profile"], second["case"]) == ("p002", "square-2048")
        report = await c.read_resource("referee://profiles/p001")
        assert report.contents[0].text == (run.dir / "profiles" / "p001.csv").read_text()
        assert '"Metric Name"' in report.contents[0].text
    assert [m for _, _, m in run.executor.profiled] == [METRICS, METRICS]
    logged = [e["data"] for e in events(run.dir) if e["kind"] == "probe_done"]
    assert [(d["tool"], d["profiled"]) for d in logged] == [("profile_kernel", True)] * 2
    written = [e["data"]["path"] for e in events(run.dir) if e["kind"] == "file_written"]
    assert "profiles/p001.csv" in written and "profiles/p002.csv" in written  # through the audited write
    run.close()


@pytest.mark.anyio
async def test_an_invalid_candidate_is_not_profiled(tmp_path):
    run = new_run(tmp_path, profile=True)
    async with client(run) as c:
        message = await refused(c, "profile_kernel", source=kernel("wrong"))
        assert message.startswith("not profiled: candidate c") and "mismatch" in message
        assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 19
    assert run.executor.profiled == [] and not (run.dir / "profiles").exists()
    run.close()


@pytest.mark.anyio
@pytest.mark.parametrize("mark, why", [("no-ncu", "ncu) is not on this machine's PATH"),
                                       ("no-counters", "ERR_NVGPUCTRPERM")])
async def test_without_ncu_or_its_counters_the_tool_says_so_in_one_line_and_the_run_goes_on(tmp_path, mark, why):
    run = new_run(tmp_path, profile=True)
    async with client(run) as c:
        message = await refused(c, "profile_kernel", source=kernel(mark))
        assert message.startswith("no profile: ") and why in message and "\n" not in message
        assert (await ok(c, "validate", source=kernel(mark)))["passed"] is True  # the run goes on
    run.close()


@pytest.mark.anyio
async def test_profiles_have_their_own_gpu_time_cap_which_a_resumed_run_keeps(tmp_path):
    run = new_run(tmp_path, profile=True, profile_gpu_seconds_per_window=0.0)
    async with client(run) as c:
        message = await refused(c, "profile_kernel", source=kernel("v1"))
        assert message.startswith("profile_kernel's GPU time for this attempt window is spent")
    run.close()
    run = new_run(tmp_path / "again", profile=True, profile_gpu_seconds_per_window=1e-9)
    async with client(run) as c:
        await ok(c, "profile_kernel", source=kernel("v1"))
        assert (await refused(c, "profile_kernel", source=kernel("v1"))).startswith("profile_kernel's GPU time")
        assert (await ok(c, "validate", source=kernel("v1")))["passed"] is True  # the other probes still answer
    run.close()
    resumed = resume_run(run.dir, executor())
    try:
        assert resumed.profile_seconds_in_window > 0 and resumed.settings.profile is True
    finally:
        resumed.close()


@pytest.mark.anyio
async def test_an_unknown_profile_id_is_not_found(tmp_path):
    run = new_run(tmp_path, profile=True)
    async with client(run) as c:
        for name in ("p001", "../run.json"):
            with pytest.raises(Exception):
                await c.read_resource(f"referee://profiles/{name}")
    run.close()


@pytest.mark.anyio
async def test_the_report_lists_the_profiles(tmp_path):
    run = new_run(tmp_path, profile=True)
    async with client(run) as c:
        await ok(c, "profile_kernel", source=kernel("v1"))
    run.close()
    report = load_report(run.dir)
    assert report.profiles == ["profiles/p001.csv"]
    assert "profiles/p001.csv" in render_report(report, "")


@pytest.mark.anyio
async def test_the_demo_shows_one_profile_in_one_line_when_served_with_profile(tmp_path):
    assert "--profile" in demo.server_parameters(tmp_path, tmp_path, profile=True).args
    assert "--profile" not in demo.server_parameters(tmp_path, tmp_path).args
    run = new_run(tmp_path, profile=True)
    lines: list[str] = []
    async with client(run) as c:
        await demo._profile(c, demo.PLAN[0], lines.append)
    run.close()
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("profile_kernel (naive): 6.912 ms; speed of light compute 62%, memory 92%; "
                               "occupancy 98% of 100% (limited by registers, block_size); top stall lg_throttle (62%); "
                               "referee://profiles/p001"), lines[0]
