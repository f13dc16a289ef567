"""Every tool call answers within its deadline (55 s by default), whatever the kernel, and its progress
notifications rise to their total: the MCP tools over a run with the fake executor, whose `spin_s`
kernels take that long per launch on the performance cases (tests/fake_executor.py)."""

from __future__ import annotations

import time

import anyio
import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from sandbox.pool import WorkerPool
from server import lifecycle
from server.call import CALL_DEADLINE_S, CallProgress, part
from server.executor import GpuExecutor
from server.run import RunSettings
from server.verify import verify_run
from tests.server_support import INITIAL, client, kernel, new_run, ok, read_json, refused
from tests.test_call_deadline import FAKE_GPU, small_matmul

SPINNING = kernel("spin_s=30")  # 30 s per launch on every performance case




async def _call(c, tool: str, **arguments):
    """(the result, its progress notifications as (progress, total, message), the seconds it took)."""
    notes: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append((done, total, message))

    started = time.monotonic()
    result = await c.call_tool(tool, arguments, progress_callback=progress)
    return result, notes, time.monotonic() - started


def _reaches_its_total(notes: list) -> bool:
    """At least two notifications, on one total, each further than the last, the last at the total."""
    values = [done for done, _, _ in notes]
    totals = {total for _, total, _ in notes}
    return (len(notes) >= 2 and len(totals) == 1 and None not in totals
            and all(b > a for a, b in zip(values, values[1:])) and values[-1] == totals.pop())


def test_the_default_bound_is_55_s(run):
    assert CALL_DEADLINE_S == 55.0 and run.call_deadline_s == 55.0


@pytest.mark.anyio
async def test_one_deadline_of_55_s_covers_every_job_of_a_call(run):
    executor = run.executor
    async with client(run) as c:
        jobs_before = len(executor.job_limits)
        await ok(c, "record_attempt", source=kernel("latency_us=90"), rationale="faster")
    (limits,) = executor.limits_seen[-1:]
    assert limits.deadline.seconds == 55.0
    jobs = executor.job_limits[jobs_before:]
    assert len(jobs) >= 5 and all(job is limits for job in jobs)  # checks and every timing round: one deadline
    assert executor.limits is None  # the call is over: no job outside a call is bounded by it
    # the baseline's launch (100 us in the fake) x 20 is below the floor: 1 s on every case
    assert dict(limits.launch_s) == {name: 1.0 for name in ("odd-31x37x29", "square-2048", "rect-2000x1500x1000",
                                                            "holdout-97x83x61")}


@pytest.mark.anyio
async def test_a_kernel_spinning_30_s_per_launch_is_rejected_too_slow_by_record_attempt_in_time(run):
    async with client(run) as c:
        result, notes, seconds = await _call(c, "record_attempt", source=SPINNING, rationale="spins")
    assert not result.is_error and seconds < 10  # one launch stopped at its 1 s limit, far inside 55 s
    answer = result.structured_content
    assert answer["verdict"] == "rejected" and answer["attempt"] == 1
    assert [(r["code"], r["case"]) for r in answer["reasons"]] == [("too_slow", "square-2048")]
    assert answer["budget"]["attempts_used"] == 1
    assert _reaches_its_total(notes) and notes[-1][2] == "attempt 1: rejected"
    history = read_json(run.dir / "history.json")["attempts"]
    assert [(e["attempt"], e["verdict"]) for e in history] == [(0, "baseline"), (1, "rejected")]
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_validate_and_time_kernel_stop_a_spinning_kernel_as_too_slow_in_time(run):
    async with client(run) as c:
        result, notes, seconds = await _call(c, "validate", source=SPINNING)
        assert not result.is_error and seconds < 10
        answer = result.structured_content
        assert not answer["passed"]
        assert [r["code"] for case in answer["cases"] for r in case["reasons"]] == ["too_slow"]
        assert _reaches_its_total(notes)

        result, notes, seconds = await _call(c, "time_kernel", source=SPINNING)
        assert result.is_error and seconds < 10
        assert "fails validation (too_slow [square-2048]" in result.content[0].text
        assert _reaches_its_total(notes)
        assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 18  # both counted


@pytest.mark.anyio
async def test_run_cases_validate_time_kernel_and_record_attempt_report_progress_to_their_total(run):
    async with client(run) as c:
        for tool, arguments in (("run_cases", {"cases": ["odd-31x37x29"]}), ("validate", {}), ("time_kernel", {}),
                                ("record_attempt", {"rationale": "tiled"})):
            result, notes, _ = await _call(c, tool, source=kernel("latency_us=80"), **arguments)
            assert not result.is_error, result.content[0].text
            assert _reaches_its_total(notes), (tool, notes)
        result, notes, _ = await _call(c, "finish", reason="done")
        assert not result.is_error and _reaches_its_total(notes), notes
        assert notes[-1][2] == "run finished; the best is attempt 1"


@pytest.mark.anyio
async def test_the_last_attempt_reports_its_holdout_check_and_ends_at_the_total(tmp_path):
    run = new_run(tmp_path, max_attempts=1)
    try:
        async with client(run) as c:
            result, notes, _ = await _call(c, "record_attempt", source=kernel("latency_us=80"), rationale="last")
        assert not result.is_error and result.structured_content["budget"]["finished"]
        assert _reaches_its_total(notes), notes
        assert any(message.startswith("holdout cases for attempt") for _, _, message in notes)
    finally:
        run.close()


@pytest.mark.anyio
async def test_jobs_that_each_fit_cannot_keep_record_attempt_past_the_calls_deadline(run):
    """0.6 s a launch is under the 1 s launch limit, and each check job (two launches) under the call's 2 s;
    the second performance case's job is cut where the call's time ends: a verdict, not an error."""
    run.call_deadline_s = 2.0
    async with client(run) as c:
        result, notes, seconds = await _call(c, "record_attempt", source=kernel("spin_s=0.6"), rationale="slow")
    assert not result.is_error and seconds < 4
    answer = result.structured_content
    assert answer["verdict"] == "rejected" and answer["budget"]["attempts_used"] == 1
    (reason,) = answer["reasons"]
    assert reason["code"] == "timeout"
    assert reason["detail"].startswith("the call's 2 s ran out during the job on case rect-2000x1500x1000")
    assert _reaches_its_total(notes)
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_the_deadline_counts_from_the_calls_arrival_waiting_for_another_call_included(run):
    answers: dict[str, str] = {}
    async with client(run) as c:
        async def call(name: str, tool: str, arguments: dict) -> None:
            answers[name] = await refused(c, tool, **arguments)

        async with anyio.create_task_group() as group:
            run.call_deadline_s = 1.5
            group.start_soon(call, "first", "validate", {"source": kernel("spin_s=0.9")})
            await anyio.sleep(0.05)
            run.call_deadline_s = 0.5  # read when a call arrives: the second's
            group.start_soon(call, "second", "run_cases", {"source": kernel("latency_us=80")})
    assert answers["first"].startswith("validate stopped: the call's 1.5 s ran out during the job on case square-2048")
    assert answers["second"].startswith("this call waited its whole 0.5 s for another call to finish")


@pytest.mark.anyio
async def test_the_real_referee_stops_a_spinning_kernel_in_every_tool(tmp_path):
    """The whole chain: the run's baseline gives the launch limits, the GPU executor's referee sends them with
    every job, and the CPU stand-in GPU worker (tests/fake_gpu_worker.py) spins 30 s per launch on the
    performance cases of a small matmul task, as the real one would, until its limit stops it."""
    task_dir = small_matmul(tmp_path / "task")
    timing = TimingSettings(warmups=2, iterations=20)
    executor = GpuExecutor(load_task(task_dir), timing, confine=False)
    executor.pool = WorkerPool(FAKE_GPU, confine=False)
    executor.peaks_cache_dir = tmp_path / "peaks"
    run = lifecycle.new_run(task_dir, tmp_path / "results", RunSettings(timing=timing), executor)
    spinning = INITIAL + '\n__device__ char stand_in[] = "fake: spin_s=30";\n'  # the marker lands in the CUBIN
    try:
        async with client(run) as c:
            for tool, arguments in (("validate", {}), ("time_kernel", {}), ("record_attempt", {"rationale": "spins"})):
                result, notes, seconds = await _call(c, tool, source=spinning, **arguments)
                assert seconds < 20 and _reaches_its_total(notes), (tool, seconds, notes)
                text = result.content[0].text
                assert "too_slow" in text and "still running after 1 s" in text, (tool, text)
                assert not executor.pool.candidate.alive  # stopped, not left spinning
            assert result.structured_content["verdict"] == "rejected"
            assert result.structured_content["budget"]["attempts_used"] == 1
        assert verify_run(run.dir).ok
    finally:
        run.close()
        executor.close()


# -- progress as MCP wants it ------------------------------------------------------------------------------
def test_progress_rises_on_one_total_and_ends_at_it():
    sent: list[tuple[float, float, str]] = []
    progress = CallProgress(lambda done, total, message: sent.append((done, total, message)))
    progress(1, 4, "checking")
    progress(1, 4, "again")  # not further: not sent
    progress(0, 3, "holdout")  # on another total, and behind: not sent
    progress(2, 3, "holdout of attempt 2")  # 2/3 of 4
    part(progress, 3.5, 4, 4)(1, 2, "half of the last part")
    progress.finish("answered")
    progress.finish("answered")  # at the total already: nothing more
    assert sent == [(1, 4, "checking"), (pytest.approx(8 / 3), 4, "holdout of attempt 2"),
                    (3.75, 4, "half of the last part"), (4, 4, "answered")]
    silent = CallProgress(None)
    silent(1, 2, "nobody asked")
    silent.finish("answered")  # nothing to send to, nothing raised
