"""bench/timing.py's pure parts: reading ncu's CSV, the report's table and verdicts, no GPU."""

import pytest

from bench import overhead_clocks, timing, timing_report
from harness.device import gpu_absent_reason

NCU_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3)
==PROF== Profiling "transpose_f32": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3","127.0.0.1","transpose_f32","1","13","(32, 8, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","4,384"
"1","4242","python3","127.0.0.1","transpose_f32","1","13","(32, 8, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","4416"
"2","4242","python3","127.0.0.1","matmul_f32","1","13","(16, 16, 1)","(128, 128, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2153.5"
"2","4242","python3","127.0.0.1","matmul_f32","1","13","(16, 16, 1)","(128, 128, 1)","0","9.0","Command line profiler metrics","sm__cycles_elapsed.avg","cycle","1000"
==PROF== Disconnected from process 4242
'''


def test_ncu_durations_are_read_in_launch_order_in_milliseconds_whatever_the_unit():
    assert timing_report.ncu_durations_ms(NCU_CSV) == pytest.approx([0.004384, 0.004416, 2.1535])


def test_the_report_compares_each_kernel_with_both_outside_clocks():
    results = {
        "kernels": [{"label": "matmul_f32 2048^3", "median_ms": 2.2, "cv": 0.001, "clock": "kernel",
                     "event_median_ms": 2.2025},
                    {"label": "transpose 512x512", "median_ms": 0.005, "cv": 0.02, "clock": "kernel"}],
        "ncu": {"median_ms": {"matmul_f32 2048^3": 2.0}},
        "triton": {"note": "do_bench did not run (exit 1): no triton"},
        "discrimination": {"case": {"name": "bench-1024x1024x2048"}, "trials": 20, "slower_ratio_median": 1.021,
                           "slower_ranked_slower": 20, "slower_beyond_noise": 19, "slower_wrongly_faster": 0,
                           "aa_false_claims": 0, "aa_ratio_spread": [0.998, 1.003]},
    }
    text = timing_report.report(results)
    assert "the referee's clock: kernel" in text
    assert "| matmul_f32 2048^3 | 2200.0 | 0.10% | 2202.5 | 2000.0 | +10.00% | — | — |" in text
    assert "| transpose 512x512 | 5.0 | 2.00% | — | — | — | — | — |" in text
    assert "triton: do_bench did not run (exit 1): no triton" in text
    assert "ranked slower in 20/20, slower beyond noise in 19/20, wrongly faster in 0/20; A/A false claims 0/20" in text


def test_the_report_sets_each_flush_beside_ncu():
    results = {"ncu": {"median_ms": {"softmax 4096x4096": 0.037}},
               "flush": {"empty_kernel_ms": 0.0034, "median_ms": {
                   "softmax 4096x4096": {"read": 0.0405, "memset": 0.0432, "none": 0.030},
                   "transpose 512x512": {"read": 0.006, "memset": 0.006, "none": 0.005}}}}
    text = timing_report.report(results)
    assert "an empty kernel reads 3.40 us" in text
    assert "| softmax 4096x4096 | 40.5 | 43.2 | 30.0 | 37.0 |" in text
    assert "| transpose 512x512 | 6.0 | 6.0 | 5.0 | — |" in text
    assert "flush: exit 1" in timing_report.report({"flush": {"note": "exit 1"}})


def test_the_bench_kernels_span_microseconds_to_milliseconds_over_at_least_eight_kernels():
    assert len(timing.KERNELS) >= 8
    assert len({label for label, *_ in timing.KERNELS}) == len(timing.KERNELS)
    for label, task, which, dims in timing.KERNELS:
        source = timing.CASES / task / f"{which}.cu"
        assert source.is_file(), label
        loaded = timing.load_task(timing.CASES / task)
        assert set(dims) == set(loaded.performance_cases[0].dims), label


def test_the_slower_variant_differs_from_the_baseline_only_by_its_extra_steps():
    base = (timing.CASES / "matmul_f32" / "initial.cu").read_text().splitlines()[2:]
    slower = timing.SLOWER.read_text().splitlines()[2:]
    changed = [(a, b) for a, b in zip(base, slower, strict=True) if a != b]
    assert changed == [("    for (int t = 0; t < k; t += TILE) {", "    for (int t = 0; t < k + k / 50; t += TILE) {")]


@pytest.mark.skipif(gpu_absent_reason() is None, reason="a GPU is present: the bench would run")
@pytest.mark.parametrize("option", ["--runs", "--trials", "--ncu-passes"])
def test_a_count_under_one_is_refused_before_anything_runs(tmp_path, capsys, option):
    with pytest.raises(SystemExit) as exit_:
        timing.main(["--out", str(tmp_path / "out"), option, "0"])
    assert exit_.value.code == 2 and "take a count of at least 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_without_a_gpu_the_bench_says_so_and_exits_2(tmp_path, capsys, monkeypatch):
    # The GPU is taken away for this test: on a GPU machine the bench would otherwise run (for minutes).
    monkeypatch.setattr(timing, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    assert timing.main(["--out", str(tmp_path)]) == 2
    assert "there is none here: no NVIDIA driver library (taken away by the test)" in capsys.readouterr().err
    assert not (tmp_path / "timing.json").exists()


def test_wall_clocked_executor_methods_count_calls_and_time_and_still_answer():
    class Executor:
        def check(self, value):
            return value * 2

    executor = Executor()
    clock = overhead_clocks.wall_clocked(executor, "check")
    assert executor.check(21) == 42 and executor.check(1) == 2
    summary = clock.summary()
    assert summary["calls"] == 2 and summary["wall_s"] >= 0


def test_ncu_values_are_split_into_the_empty_kernel_then_each_kernel_by_input_set():
    repeats, sets = timing_report.REPEATS, timing_report.SETS
    empty = [0.002] * repeats
    # kernel A: set s reads 1 + s ms in every round; kernel B: 5 ms throughout
    a = [1.0 + s for _ in range(repeats) for s in range(sets)]
    b = [5.0] * (repeats * sets)
    summary = timing_report.ncu_summary(empty + a + b, ["A", "B"])
    assert summary["empty_kernel_ms"] == 0.002
    assert summary["per_set_ms"]["A"] == [1.0, 2.0, 3.0, 4.0][:sets]
    assert summary["median_ms"]["A"] == pytest.approx(sorted(a)[len(a) // 2 - 1] / 2 + sorted(a)[len(a) // 2] / 2)
    assert summary["median_ms"]["B"] == 5.0
    assert timing_report.ncu_summary(empty + a, ["A", "B"]) is None  # a kernel's values missing: no summary


def test_several_ncu_passes_are_compared_by_their_median_and_their_spread_is_shown():
    passes = [{"empty_kernel_ms": e, "sets": 4, "repeats_per_set": 7, "median_ms": {"k": m}, "per_set_ms": {"k": [m] * 4}}
              for e, m in ((0.0014, 0.0440), (0.0013, 0.0436), (0.0015, 0.0451))]
    combined = timing_report.ncu_combined(passes)
    assert combined["passes"] == 3 and combined["pass_medians_ms"] == {"k": [0.0440, 0.0436, 0.0451]}
    assert combined["median_ms"] == {"k": 0.0440} and combined["empty_kernel_ms"] == 0.0014
    assert combined["per_set_ms"] == {"k": [0.0440] * 4}  # the first pass's
    assert timing_report.ncu_combined(passes[:1]) is passes[0]  # one pass: as it was, no spread
    text = timing_report.report({"ncu": combined})
    assert "ncu's own spread over 3 passes" in text
    assert "| k | 43.6 | 45.1 | 3.41% |" in text  # (45.1 - 43.6) / 44.0
    assert "own spread" not in timing_report.report({"ncu": passes[0]})


def test_the_report_shows_the_kernel_clock_step_by_step_beside_ncu():
    results = {"ncu": {"median_ms": {"layernorm 32768x768": 0.1093}, "empty_kernel_ms": 0.0016},
               "clock": {"tracing": "serial", "empty_kernel_ms": 0.0006, "median_ms": {
                   "layernorm 32768x768": {"one set": 0.1071, "rotated sets": 0.1080}}},
               "clock_concurrent": {"note": "the kernel-clock steps with concurrent tracing did not run (exit 1)"}}
    text = timing_report.report(results)
    assert "ncu reads an empty kernel at 1.60 us" in text
    assert "serial tracing (an empty kernel reads 0.60 us)" in text
    assert "| kernel | one set | rotated sets | ncu (us) |" in text
    assert "| layernorm 32768x768 | 107.1 | 108.0 | 109.3 |" in text
    assert "clock_concurrent: the kernel-clock steps with concurrent tracing did not run (exit 1)" in text


def test_the_report_compares_each_kernel_net_of_each_clocks_empty_kernel():
    results = {"kernels": [{"label": "softmax 4096x4096", "median_ms": 0.0383, "cv": 0.002, "kernel_floor_ms": 0.0023},
                           {"label": "transpose 512x512", "median_ms": 0.0044, "cv": 0.01, "kernel_floor_ms": 0.0023}],
               "ncu": {"median_ms": {"softmax 4096x4096": 0.0373}, "empty_kernel_ms": 0.0014}}
    text = timing_report.report(results)
    assert "the referee's 2.30 us, ncu's 1.40 us" in text
    assert "| softmax 4096x4096 | 36.0 | 35.9 | +0.28% |" in text
    assert "| transpose 512x512 | 2.1 |" not in text  # no ncu value: no net row


def test_each_target_is_judged_from_the_measurements_and_unmeasured_ones_say_so():
    results = {
        "kernels": [{"label": "short", "median_ms": 0.0045, "cv": 0.03, "kernel_floor_ms": 0.0023},
                    {"label": "mid", "median_ms": 0.0220, "cv": 0.004, "kernel_floor_ms": 0.0023},
                    {"label": "long", "median_ms": 0.1112, "cv": 0.001, "kernel_floor_ms": 0.0025}],
        "ncu": {"median_ms": {"short": 0.0032, "mid": 0.0208, "long": 0.1104}, "empty_kernel_ms": 0.0014},
        "discrimination": {"case": {"name": "bench"}, "trials": 20, "slower_ratio_median": 1.02, "slower_ranked_slower": 20,
                           "slower_beyond_noise": 19, "slower_wrongly_faster": 0, "aa_false_claims": 1,
                           "aa_ratio_spread": [0.998, 1.006]},
        "overhead": {"record_attempt_wall_s": 2.10, "bound_s": 2.29, "verdict": "valid-faster", "compile_s": 0.06,
                     "gpu_busy_s": 1.48, "host_s": 0.56, "worker_cold_start_s": 1.1, "compile_ms": 60.0,
                     "cache_hit_ms": 0.1}}
    judged = {name: (met, what) for name, met, what in timing_report.targets(results)}
    assert judged["within 2% of ncu from 20 us"] == (False, "at most 5.77% off, over 2 kernels")  # 22.0 against 20.8
    met, what = judged["the same, net of each clock's empty kernel"]
    assert met and what == "at most 1.55% off"  # (22.0 - 2.3) / (20.8 - 1.4): the referee's floor is the median, 2.3 us
    assert judged["CV <= 0.5% over runs from 50 us"] == (True, "at most 0.10%, over 1 kernels")
    assert judged["a 2% slower copy slower beyond noise in >= 19 of 20, never faster"][0] is True
    assert judged["A/A: no false claim"] == (False, "1 of 20")
    assert judged["record_attempt <= compile + 1.3 x GPU busy + 0.3 s"] == (True, "2.10 s against 2.29 s")
    assert timing_report.targets({})[0] == ("within 2% of ncu from 20 us", None, "no ncu values")
    assert "| A/A: no false claim | no | 1 of 20 |" in timing_report.report(results)


def test_fresh_inputs_are_judged_against_the_rotated_sets_from_50_us_and_their_cost_is_shown():
    def protocol(median_ms, busy_us, wall_us):
        return {"median_ms": median_ms, "gpu_busy_us_per_launch": busy_us, "wall_us_per_launch": wall_us}

    results = {"protocols": {"rounds": 3, "kernels": [
        {"label": "short", "fresh": protocol(0.0044, 372.3, 2230), "rotated": protocol(0.0045, 293.9, 1528),
         "ratio": 0.0044 / 0.0045},  # 2% apart, but under 50 us: not judged
        {"label": "long", "fresh": protocol(2.1527, 2991.8, 6531), "rotated": protocol(2.1500, 2742.1, 7323),
         "ratio": 2.1527 / 2.1500}]}}
    judged = {name: (met, what) for name, met, what in timing_report.targets(results)}
    assert judged["fresh inputs within 1% of the rotated sets from 50 us"] == (True, "at most 0.13% apart, over 1 kernels")
    results["protocols"]["kernels"][1]["ratio"] = 1.02
    judged = {name: (met, what) for name, met, what in timing_report.targets(results)}
    assert judged["fresh inputs within 1% of the rotated sets from 50 us"][0] is False
    assert "| long | 2152.7 | 2150.0 | 1.0200 | 2991.8 / 2742.1 | 6531 / 7323 |" in timing_report.report(results)


def test_the_bench_compiles_the_referees_own_kernels_as_a_worker_does():
    from bench.direct import utility_cubin

    assert utility_cubin("sm_90")[:4] == b"\x7fELF"
