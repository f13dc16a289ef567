"""harness/profile_digest.py: Nsight Compute's raw CSV read into the digest profile_kernel answers with."""

from pathlib import Path

import pytest

from harness import profile_digest
from harness.profile_digest import NcuFormatError, digest

NCU = Path(__file__).parent / "fixtures" / "ncu"
NAIVE = (NCU / "naive-matmul_f32-square-2048.csv").read_text()
BLOCKED = (NCU / "register_blocked-matmul_f32-square-2048.csv").read_text()


def test_values_are_read_with_thousands_separators_and_units_in_the_digests_own():
    naive, blocked = digest(NAIVE), digest(BLOCKED)
    assert naive.duration_ms == pytest.approx(6.912448)      # "6,912,448" nsecond
    assert blocked.duration_ms == pytest.approx(0.86835)     # "868.35" usecond
    assert naive.memory.dram_bytes == pytest.approx(52.43e6)  # Mbyte
    assert blocked.memory.dram_bytes == 50_331_648           # "50,331,648" byte
    assert naive.memory.l1_bytes == pytest.approx(68.72e9)    # Gbyte
    assert (naive.kernel, naive.block_size, naive.grid_size) == ("matmul_f32", "(16, 16, 1)", "(128, 128, 1)")


def test_occupancy_says_which_resource_limits_it():
    naive, blocked = digest(NAIVE), digest(BLOCKED)
    assert blocked.occupancy.limited_by == ["registers"]
    assert naive.occupancy.limited_by == ["registers", "block_size"]  # a tie: both named
    assert (blocked.occupancy.achieved_pct, blocked.occupancy.theoretical_pct) == (24.61, 25.0)
    assert blocked.occupancy.registers_per_thread == 128


def test_top_stalls_are_ranked_with_their_share_and_leave_out_the_issuing_warp():
    stalls = digest(NAIVE).top_stalls
    assert [s.reason for s in stalls[:2]] == ["lg_throttle", "long_scoreboard"]
    assert len(stalls) == profile_digest.TOP_STALLS and "selected" not in [s.reason for s in stalls]
    total = 18.24 + 9.61 + 0.82 + 0.47 + 0.31 + 0.09
    assert stalls[0].share == pytest.approx(18.24 / total)


def test_flops_roofline_and_access_patterns_tell_the_two_kernels_apart():
    naive, blocked = digest(NAIVE), digest(BLOCKED)
    flops = 2 * 8_589_934_592  # an FMA is two operations
    assert naive.compute.flops["fp32"] == blocked.roofline.flops == flops
    assert blocked.compute.flops_per_second["fp32"] == pytest.approx(flops / 0.86835e-3)
    assert blocked.roofline.arithmetic_intensity == pytest.approx(flops / 50_331_648)
    assert blocked.compute.fma_pipe_pct > naive.compute.fma_pipe_pct
    assert naive.memory.l1_bytes > 10 * blocked.memory.l1_bytes
    assert naive.memory.global_load_sectors_per_request == pytest.approx(1_610_612_736 / 536_870_912)
    assert blocked.memory.shared_load_bank_conflicts == 1204


def test_n_a_and_missing_metrics_are_none_and_listed_never_an_error():
    naive = digest(NAIVE)
    assert naive.compute.flops["fp16"] is None  # "n/a" for hfma, the others absent
    stall = profile_digest.STALL.format("tex_throttle")
    assert stall in naive.missing_metrics and profile_digest.DURATION not in naive.missing_metrics
    only_duration = "\n".join(NAIVE.splitlines()[:4] + [line for line in NAIVE.splitlines()
                                                         if profile_digest.DURATION in line])
    bare = digest(only_duration)
    assert bare.duration_ms == pytest.approx(6.912448)
    assert bare.occupancy.limited_by == [] and bare.top_stalls == [] and bare.roofline.arithmetic_intensity is None
    assert len(bare.missing_metrics) == len(profile_digest.METRICS) - 1


def test_output_without_a_profiled_kernel_is_a_format_error():
    with pytest.raises(NcuFormatError):
        digest("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - no permission\n")


def test_the_metrics_asked_for_cover_every_part_of_the_digest_once():
    metrics = profile_digest.METRICS
    assert len(metrics) == len(set(metrics))
    for name in (profile_digest.DURATION, profile_digest.SOL_COMPUTE, profile_digest.DRAM_BYTES,
                 *profile_digest.OCCUPANCY_LIMITS.values(), *profile_digest.BANK_CONFLICTS.values()):
        assert name in metrics


def raw_page(text: str) -> str:
    """The same kernel in the raw page's layout: one row per kernel, a column per metric, its units under the
    header (what `ncu --page raw --csv` prints)."""
    rows = profile_digest.raw_rows(text)
    identity = list(profile_digest.IDENTITY)
    metrics = [r["Metric Name"] for r in rows]
    quoted = lambda cells: ",".join(f'"{c}"' for c in cells)  # noqa: E731
    return "\n".join(["==PROF== Disconnected from process 1", quoted(identity + metrics),
                      quoted([""] * len(identity) + [r["Metric Unit"] for r in rows]),
                      quoted([rows[0][k] for k in identity] + [r["Metric Value"] for r in rows])])


@pytest.mark.parametrize("text", [NAIVE, BLOCKED], ids=["naive", "blocked"])
def test_the_raw_page_layout_gives_the_same_digest_as_the_details_layout(text):
    wide = raw_page(text)
    assert '"Metric Name"' not in wide and profile_digest.has_kernel(wide) and profile_digest.has_kernel(text)
    assert digest(wide) == digest(text)


def test_a_header_without_a_kernel_row_is_not_a_profile():
    header_and_units = "\n".join(raw_page(NAIVE).splitlines()[:3])
    assert not profile_digest.has_kernel(header_and_units)
    with pytest.raises(NcuFormatError):
        digest(header_and_units)


def test_the_raw_page_ncu_printed_for_profile_kernel_is_read_whole():
    # profile_kernel's own output on an H100 (the ncu of CUDA 13.0): the naive kernel on square-2048.
    recorded = digest((NCU / "raw-page-naive-matmul_f32-square-2048.csv").read_text())
    assert (recorded.kernel, recorded.block_size, recorded.grid_size) == ("matmul_f32", "(16, 16, 1)", "(128, 128, 1)")
    assert recorded.duration_ms == pytest.approx(3.904256)
    assert recorded.missing_metrics == []
    assert recorded.compute.flops["fp32"] == 2 * 2048 ** 3
    assert recorded.occupancy.limited_by == ["registers", "block_size"]
    assert recorded.top_stalls[0].reason == "long_scoreboard"
