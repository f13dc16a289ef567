"""Fresh inputs without a GPU: the host's draw of the device generator, the wire specs, the launch
records of the kernel clock, and the parent's judgement of a launch that is not the declared one."""

import numpy as np
import pytest

from harness.worker_side import buffers, fresh_inputs
from harness import jobs
from harness.worker_side.nvrtc import compile_kernel
from harness.settings import TimingSettings
from harness.judging import undeclared_launches
from harness.timing_protocol import _with_audits
from harness.worker_side.utility_kernels import UTILITY_SOURCE
from harness.worker_side.kernel_clock import KIND_CONCURRENT_KERNEL, KIND_EXTERNAL_CORRELATION, Activity, launch_records
from harness.task import load_task
from harness.results import CaseTiming, Reason, ReasonCode
from tests.test_cli import MATMUL

N = 200_000


def test_uniform_and_normal_draws_follow_their_distribution():
    uniform = fresh_inputs.draw_on_host(fresh_inputs.draw_spec("uniform", "float32", low=-1.0, high=3.0), N, 7, 0)
    assert uniform.dtype == np.float32 and uniform.min() >= -1.0 and uniform.max() < 3.0
    assert abs(uniform.mean() - 1.0) < 0.02 and abs(uniform.var() - 16 / 12) < 0.02
    normal = fresh_inputs.draw_on_host(fresh_inputs.draw_spec("normal", "float64", mean=0.5, std=2.0), N, 7, 1)
    assert abs(normal.mean() - 0.5) < 0.03 and abs(normal.std() - 2.0) < 0.03


def test_integer_draws_cover_their_range_and_nothing_else():
    drawn = fresh_inputs.draw_on_host(fresh_inputs.draw_spec("integers", "int8", low=-3, high=4), N, 9, 2)
    assert drawn.dtype == np.int8 and set(np.unique(drawn)) == set(range(-3, 4))
    counts = np.bincount(drawn.astype(np.int64) + 3)
    assert counts.min() > N / 7 * 0.95
    wide = fresh_inputs.draw_on_host(fresh_inputs.draw_spec("integers", "int64", low=-(1 << 40), high=1 << 40), N, 9, 3)
    assert wide.min() >= -(1 << 40) and wide.max() < 1 << 40 and wide.min() < -(1 << 39) and wide.max() > 1 << 39


def test_half_precision_draws_are_the_rounded_single_precision_values():
    spec16 = fresh_inputs.draw_spec("uniform", "bfloat16", low=-1.0, high=1.0)
    spec32 = fresh_inputs.draw_spec("uniform", "float32", low=-1.0, high=1.0)
    words = fresh_inputs.draw_on_host(spec16, 1000, 5, 4)
    single = fresh_inputs.draw_on_host(spec32, 1000, 5, 4)
    import ml_dtypes
    assert np.array_equal(words, single.astype(ml_dtypes.bfloat16).view("<u2"))


def test_keys_and_streams_give_independent_draws_and_the_same_ones_again():
    spec = fresh_inputs.draw_spec("uniform", "float32", low=0.0, high=1.0)
    first = fresh_inputs.draw_on_host(spec, 1000, 1, 0)
    assert np.array_equal(first, fresh_inputs.draw_on_host(spec, 1000, 1, 0))
    for other in (fresh_inputs.draw_on_host(spec, 1000, 2, 0), fresh_inputs.draw_on_host(spec, 1000, 1, 1)):
        assert (first != other).mean() > 0.99


def test_each_launch_of_a_job_has_a_key_of_its_own_that_says_nothing_of_the_others():
    keys = [fresh_inputs.launch_key(0xC0FFEE, launch) for launch in range(1000)]
    assert len(set(keys)) == 1000 and all(0 <= k < 2**64 for k in keys)
    assert keys[5] == fresh_inputs.launch_key(0xC0FFEE, 5)  # the reference draws the same for launch 5
    assert fresh_inputs.launch_key(0xC0FFEF, 5) != keys[5]
    assert 0.4 < np.mean([bin(a ^ b).count("1") / 64 for a, b in zip(keys, keys[1:])]) < 0.6


def test_a_job_draws_each_input_of_a_launch_with_that_launchs_key_and_the_input_as_its_stream():
    from harness.worker_side.job import Job as WorkerJob

    calls = []

    class Utilities:
        def generate(self, spec, ptr, elements, key, stream, changed):
            calls.append((spec, ptr, elements, key, stream, changed))

    class Buffer:
        def __init__(self, ptr):
            self.ptr = ptr

    class Job:
        def drawn_inputs(self, set_index):
            return [({"nbytes": 400, "itemsize": 4}, "spec-a", Buffer(1000 + set_index), 0),
                    ({"nbytes": 80, "itemsize": 8}, "spec-b", Buffer(2000 + set_index), 1)]

    WorkerJob.draw(Job(), Utilities(), 2, 77, 13)
    WorkerJob.draw(Job(), Utilities(), 2, 77, 13, changed=5)
    key = fresh_inputs.launch_key(77, 13)
    assert calls == [("spec-a", 1002, 100, key, 0, 0), ("spec-b", 2002, 10, key, 1, 0),
                     ("spec-a", 1002, 100, key, 0, 5), ("spec-b", 2002, 10, key, 1, 5)]


def test_a_generator_the_device_cannot_draw_is_refused_by_name():
    with pytest.raises(ValueError, match="npy"):
        fresh_inputs.draw_spec("npy", "float32")
    with pytest.raises(ValueError, match="empty"):
        fresh_inputs.draw_spec("integers", "int32", low=4, high=4)


def test_the_generator_compiles_with_the_referees_own_kernels():
    compiled = compile_kernel(UTILITY_SOURCE, "referee_generate", arch="sm_90")
    assert compiled.ok, compiled.log


def test_a_fresh_time_job_draws_every_generated_input_and_sends_none():
    task = load_task(MATMUL)
    case = task.case("square-2048")
    layout = jobs.Layout.for_case(task, case.dims)
    draws = {"a": fresh_inputs.draw_spec("uniform", "float32", -1, 1),
             "b": fresh_inputs.draw_spec("normal", "float32", mean=0, std=1)}
    header, blobs = jobs.make_time_job(b"cubin", "matmul_f32", layout, task.launch.resolve(case), [{}] * 4,
                                  warmups=10, iterations=100, cold_l2=True, checked_launches=[5, 9, 70],
                                  guard_seed=1, fresh=jobs.FreshDraws(key=123, draws=draws))
    assert blobs == [b"cubin"] and header["fresh"] == {"key": 123}
    assert all(entry == {"key": None, "sent": False, "drawn": draws[name]}
               for entries in header["inputs"] for entry, name in zip(entries, ("a", "b")))
    reference, ref_blobs = jobs.make_draw_run_job(b"ref", "matmul_f32", layout, task.launch.resolve(case), {},
                                             jobs.FreshDraws(key=123, draws=draws), [15, 19, 80], guard_seed=2)
    assert reference["draws"] == {"key": 123, "launches": [15, 19, 80]} and ref_blobs == [b"ref"]
    assert buffers.audit_slots([9, 5], 1) == ["5/0", "9/0"]


def test_the_default_protocol_is_fresh_with_ten_audits_per_hundred_launches():
    settings = TimingSettings()
    assert settings.fresh_inputs and settings.checked_launches == 10
    assert TimingSettings(iterations=400).checked_launches == 40


def _kernel(correlation, name, grid, block):
    return Activity(KIND_CONCURRENT_KERNEL, 0, 1, correlation, name=name, grid=grid, block=block)


def test_each_tagged_launch_lists_the_kernels_it_ran():
    records = [Activity(KIND_EXTERNAL_CORRELATION, 0, 0, 5, 1), _kernel(5, "k", (4, 2, 1), (32, 8, 1)),
               Activity(KIND_EXTERNAL_CORRELATION, 0, 0, 6, 2), _kernel(6, "k", (4, 2, 1), (32, 8, 1)),
               _kernel(6, "extra", (1, 1, 1), (1, 1, 1)), _kernel(7, "flush", (528, 1, 1), (512, 1, 1))]
    assert launch_records(records, [1, 2, 3]) == [
        [["k", [4, 2, 1], [32, 8, 1]]],
        [["k", [4, 2, 1], [32, 8, 1]], ["extra", [1, 1, 1], [1, 1, 1]]],
        []]


HEADER = {"kernel": "matmul_f32", "launch": {"grid": [4, 2, 1], "block": [32, 8, 1], "shared_bytes": 0}}
DECLARED = ["matmul_f32", [4, 2, 1], [32, 8, 1]]


@pytest.mark.parametrize("second, seen", [
    ([DECLARED, ["other", [1, 1, 1], [1, 1, 1]]], "other grid (1, 1, 1)"),
    ([["matmul_f32", [8, 2, 1], [32, 8, 1]]], "grid (8, 2, 1)"),
    ([], "no kernel"),
])
def test_a_timed_launch_that_is_not_the_declared_one_is_refused(second, seen):
    reasons = undeclared_launches([[DECLARED], second, [DECLARED]], HEADER, "square")
    assert [r.code for r in reasons] == [ReasonCode.LAUNCH_NOT_AS_DECLARED]
    assert "1 timed launches" in reasons[0].detail and "launch 1 ran" in reasons[0].detail
    assert seen in reasons[0].detail


def test_the_declared_launch_or_no_records_pass():
    assert undeclared_launches([[DECLARED]] * 3, HEADER, "square") == []
    assert undeclared_launches(None, HEADER, "square") == []  # events alone, or a library call
    assert undeclared_launches([[]], {"vendor": {}}, "square") == []


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def test_a_failed_audit_fails_its_case_once_whatever_the_batches():
    timing = CaseTiming(case="square", passed=True)
    wrong = [Reason(code=ReasonCode.TIMED_OUTPUT_MISMATCH, case="square", detail="1 of 3 audited")]
    assert _with_audits(timing, [_Done([]), _Done([])]) is timing
    failed = _with_audits(timing, [_Done([]), _Done(wrong), _Done(wrong)])
    assert not failed.passed and failed.reasons == wrong


def test_launches_of_even_length_pass_and_work_shifted_between_launches_does_not():
    from harness.judging import UNEVEN_MEAN_OVER_MEDIAN, uneven_launches
    from harness.stats import summarize

    honest = summarize([1.0 + 0.001 * (i % 7) for i in range(97)] + [1.13, 1.2, 1.1])  # a few slow launches
    assert uneven_launches(honest, "square") == []
    # three launches of four copy an answer the fourth computed for them: the same work, a quarter of the median
    shifted = summarize([4.0 if i % 4 == 0 else 0.01 for i in range(100)])
    (reason,) = uneven_launches(shifted, "square")
    assert reason.code is ReasonCode.UNEVEN_LAUNCHES and reason.case == "square"
    assert f"beyond the {UNEVEN_MEAN_OVER_MEDIAN:g} allowed" in reason.detail


def test_a_timed_loop_that_cannot_start_frees_everything_it_made(monkeypatch):
    """The worker's timed loop with its GPU calls stubbed: the third event pair fails to be made, and every
    allocation, every pair made before it and the job are released; the clock is not begun."""
    from harness.worker_side import timed_loop

    made, released = [], []

    class Made:
        def __init__(self, *args):
            if sum(isinstance(m, Pair) for m in made) == 2 and isinstance(self, Pair):
                raise RuntimeError("cuEventCreate failed")
            made.append(self)

        def free(self):
            released.append(self)

        destroy = free

    class Pair(Made):
        pass

    class Job:
        arrays = [{"kind": "output", "nbytes": 64}]

        def __init__(self, *args, **kwargs):
            made.append(self)

        def outputs(self, set_index):
            return [(0, self.arrays[0], None)]

        def close(self):
            released.append(self)

    class Resident:
        @staticmethod
        def making_room(allocate, *args):
            return allocate(*args)

    class Evidence:  # the evidence context (harness/worker_side/evidence.py): counters and snapshots
        allocate = Made

    class Utilities:
        clock, resident, evidence, begun = None, Resident(), Evidence(), False

        def begin(self):
            self.begun = True

    monkeypatch.setattr(timed_loop, "Job", Job)
    monkeypatch.setattr(timed_loop.gpu, "Allocation", Made)
    monkeypatch.setattr(timed_loop.gpu, "EventPair", Pair)
    utilities = Utilities()
    header = {"sets": 4, "iterations": 5, "warmups": 1, "checked_launches": [1, 3], "fresh": {"key": 1}}
    with pytest.raises(RuntimeError, match="cuEventCreate"):
        timed_loop.TimedLoop(None, utilities, header, [b"cubin"], None)
    # the job, the scratch, the evidence context's counters and snapshots, 2 pairs
    assert len(made) == 6 and set(map(id, made)) == set(map(id, released))
    assert not utilities.begun
