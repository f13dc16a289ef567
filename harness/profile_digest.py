"""Nsight Compute's CSV (`ncu --csv --page raw --metrics ...`) read into a compact, typed digest.

ncu prints a kernel's metrics in one of two layouts: the raw page's one row per kernel, a column per metric
and a row of units under the header; or the details page's one row per metric ("Metric Name", "Metric Unit",
"Metric Value"). Both are read.

Pure: no GPU, no ncu. The metrics asked for are METRICS; a metric ncu does not give (another device, another
ncu version, "n/a") is None in the digest, never an error. Values are read in any unit ncu prints ("1,568" ns,
"2.15" msecond, "3.2" Tbyte/second) and given in the digest's own (ms, bytes, per second, percent).
"""

from __future__ import annotations

import csv
import io

from pydantic import BaseModel

DURATION = "gpu__time_duration.sum"
SOL_COMPUTE = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
SOL_MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L2_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L1_PCT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
L2_HIT = "lts__t_sector_hit_rate.pct"
L1_HIT = "l1tex__t_sector_hit_rate.pct"
DRAM_BYTES, L2_BYTES, L1_BYTES = "dram__bytes.sum", "lts__t_bytes.sum", "l1tex__t_bytes.sum"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
REGISTERS = "launch__registers_per_thread"
# Blocks per SM each resource allows: the smallest is what limits the theoretical occupancy.
OCCUPANCY_LIMITS = {"registers": "launch__occupancy_limit_registers",
                    "shared_memory": "launch__occupancy_limit_shared_mem",
                    "block_size": "launch__occupancy_limit_warps",
                    "blocks_per_sm": "launch__occupancy_limit_blocks"}
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
                 "tex_throttle", "math_pipe_throttle", "wait", "not_selected", "selected", "no_instruction",
                 "branch_resolving", "dispatch_stall", "drain", "imc_miss", "misc", "sleeping")
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
FMA_PIPE = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
FMA_INSTRUCTIONS = "sm__inst_executed_pipe_fma.sum"
# Floating-point operations per precision: an FMA counts two.
FLOP_COUNTS = {precision: {f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": (2 if op == "fma" else 1)
                           for op in ("fma", "add", "mul")}
               for precision, p in (("fp32", "f"), ("fp64", "d"), ("fp16", "h"))}
BANK_CONFLICTS = {"load": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                  "store": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"}
GLOBAL_ACCESS = {"load": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                          "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
                 "store": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                           "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum")}

METRICS: tuple[str, ...] = tuple(dict.fromkeys([
    DURATION, SOL_COMPUTE, SOL_MEMORY, DRAM_PCT, L2_PCT, L1_PCT, L2_HIT, L1_HIT, DRAM_BYTES, L2_BYTES, L1_BYTES,
    ACHIEVED_OCCUPANCY, THEORETICAL_OCCUPANCY, REGISTERS, *OCCUPANCY_LIMITS.values(),
    *(STALL.format(r) for r in STALL_REASONS), FMA_PIPE, TENSOR_PIPE, FMA_INSTRUCTIONS,
    *(name for counts in FLOP_COUNTS.values() for name in counts), *BANK_CONFLICTS.values(),
    *(name for pair in GLOBAL_ACCESS.values() for name in pair)]))

TOP_STALLS = 5

# Unit scales to the digest's units: seconds' to ms, bytes' to bytes, rates' to per second. Lower-cased.
_TIME_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
            "second": 1e3}
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


class NcuFormatError(ValueError):
    """The text holds no profiled kernel in ncu's raw CSV format."""


class Stall(BaseModel):
    reason: str
    warps_per_issue: float  # warps stalled for this reason per issued instruction
    share: float            # of all stall reasons' warps, 0..1


class OccupancyDigest(BaseModel):
    achieved_pct: float | None = None
    theoretical_pct: float | None = None
    registers_per_thread: int | None = None
    limited_by: list[str] = []              # the resource(s) with the fewest blocks per SM
    blocks_per_sm_by_limit: dict[str, float | None] = {}


class MemoryDigest(BaseModel):
    dram_throughput_pct: float | None = None
    l2_throughput_pct: float | None = None
    l1_throughput_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    l1_hit_rate_pct: float | None = None
    dram_bytes: float | None = None
    l2_bytes: float | None = None
    l1_bytes: float | None = None
    global_load_sectors_per_request: float | None = None   # 4 is a coalesced 32-bit warp load; more is waste
    global_store_sectors_per_request: float | None = None
    shared_load_bank_conflicts: float | None = None
    shared_store_bank_conflicts: float | None = None


class ComputeDigest(BaseModel):
    fma_pipe_pct: float | None = None
    tensor_pipe_pct: float | None = None
    fma_instructions: float | None = None
    flops: dict[str, float | None] = {}              # per precision (fp32, fp64, fp16): operations, an FMA two
    flops_per_second: dict[str, float | None] = {}


class Roofline(BaseModel):
    flops: float | None = None
    dram_bytes: float | None = None
    arithmetic_intensity: float | None = None  # flops per DRAM byte
    flops_per_second: float | None = None


class ProfileDigest(BaseModel):
    kernel: str | None = None
    block_size: str | None = None
    grid_size: str | None = None
    duration_ms: float | None = None
    sol_compute_pct: float | None = None   # speed of light: the busiest compute unit, % of its peak
    sol_memory_pct: float | None = None    # the busiest memory unit, % of its peak
    memory: MemoryDigest
    occupancy: OccupancyDigest
    compute: ComputeDigest
    top_stalls: list[Stall] = []
    roofline: Roofline
    missing_metrics: list[str] = []        # asked for and not given by ncu (or n/a)


def raw_rows(text: str) -> list[dict[str, str]]:
    """The CSV rows of ncu's output, its ==PROF== and ==WARNING== lines (and anything else) left out."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def number(value: str) -> float | None:
    """A metric's value as ncu prints it ("1,568", "83.41", "n/a"); None when it is not a number."""
    try:
        return float(value.replace(",", "").strip())
    except (ValueError, AttributeError):
        return None


def in_base_units(value: float, unit: str) -> float:
    """ms for a time, bytes for a size, per second for a rate, the value itself otherwise (%, inst, warp)."""
    unit = unit.strip().lower()
    if unit in _TIME_MS:
        return value * _TIME_MS[unit]
    base = unit.split("/")[0]  # a rate's prefix is its amount's: "Tbyte/second" is 1e12 bytes per second
    for name in ("byte", "flop", "inst", "sector", "request", "cycle"):
        if base.endswith(name) and base[:-len(name)] in _PREFIX:
            return value * _PREFIX[base[:-len(name)]]
    return value


IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC")


def has_kernel(text: str) -> bool:
    """Whether ncu's output holds at least one profiled kernel, in either layout."""
    try:
        kernel_metrics(text)
    except NcuFormatError:
        return False
    return True


def kernel_metrics(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """The first profiled kernel's identity (name, block and grid sizes) and its metrics in base units."""
    rows = raw_rows(text)
    if rows and "Metric Name" in rows[0]:
        return _metric_per_row(rows)
    if len(rows) >= 2 and "Kernel Name" in rows[0] and rows[0].get("ID") == "" and rows[1].get("ID"):
        return _metric_per_column(units=rows[0], row=rows[1])
    raise NcuFormatError("no ncu CSV in the output (no profiled kernel)")


def _metric_per_row(rows: list[dict[str, str]]) -> tuple[dict[str, str], dict[str, float]]:
    """The details layout: the first kernel's rows, one metric each."""
    first = rows[0].get("ID")
    identity = {k: rows[0].get(k, "") for k in ("Kernel Name", "Block Size", "Grid Size")}
    values = {}
    for row in rows:
        if row.get("ID") != first:
            break
        value = number(row.get("Metric Value", ""))
        if value is not None:
            values[row["Metric Name"]] = in_base_units(value, row.get("Metric Unit", ""))
    return identity, values


def _metric_per_column(units: dict[str, str], row: dict[str, str]) -> tuple[dict[str, str], dict[str, float]]:
    """The raw layout: the first kernel's row, its units in the row under the header."""
    identity = {k: row.get(k, "") for k in ("Kernel Name", "Block Size", "Grid Size")}
    values = {}
    for name, text in row.items():
        if name is None or name in IDENTITY:
            continue
        value = number(text)
        if value is not None:
            values[name] = in_base_units(value, units.get(name) or "")
    return identity, values


def digest(text: str) -> ProfileDigest:
    """The digest of the first kernel profiled in `text` (ncu's CSV). NcuFormatError when there is none."""
    identity, m = kernel_metrics(text)
    duration_ms = m.get(DURATION)
    flops = {precision: _flops(m, counts) for precision, counts in FLOP_COUNTS.items()}
    total = sum(v for v in flops.values() if v is not None) if any(v is not None for v in flops.values()) else None
    return ProfileDigest(
        kernel=identity["Kernel Name"] or None, block_size=identity["Block Size"] or None,
        grid_size=identity["Grid Size"] or None, duration_ms=duration_ms,
        sol_compute_pct=m.get(SOL_COMPUTE), sol_memory_pct=m.get(SOL_MEMORY),
        memory=MemoryDigest(
            dram_throughput_pct=m.get(DRAM_PCT), l2_throughput_pct=m.get(L2_PCT), l1_throughput_pct=m.get(L1_PCT),
            l2_hit_rate_pct=m.get(L2_HIT), l1_hit_rate_pct=m.get(L1_HIT), dram_bytes=m.get(DRAM_BYTES),
            l2_bytes=m.get(L2_BYTES), l1_bytes=m.get(L1_BYTES),
            global_load_sectors_per_request=_ratio(m.get(GLOBAL_ACCESS["load"][0]), m.get(GLOBAL_ACCESS["load"][1])),
            global_store_sectors_per_request=_ratio(m.get(GLOBAL_ACCESS["store"][0]),
                                                    m.get(GLOBAL_ACCESS["store"][1])),
            shared_load_bank_conflicts=m.get(BANK_CONFLICTS["load"]),
            shared_store_bank_conflicts=m.get(BANK_CONFLICTS["store"])),
        occupancy=_occupancy(m),
        compute=ComputeDigest(
            fma_pipe_pct=m.get(FMA_PIPE), tensor_pipe_pct=m.get(TENSOR_PIPE), fma_instructions=m.get(FMA_INSTRUCTIONS),
            flops=flops, flops_per_second={p: _per_second(v, duration_ms) for p, v in flops.items()}),
        top_stalls=_top_stalls(m),
        roofline=Roofline(flops=total, dram_bytes=m.get(DRAM_BYTES), arithmetic_intensity=_ratio(total, m.get(DRAM_BYTES)),
                          flops_per_second=_per_second(total, duration_ms)),
        missing_metrics=[name for name in METRICS if name not in m])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _per_second(amount: float | None, duration_ms: float | None) -> float | None:
    return None if amount is None or not duration_ms else amount / (duration_ms * 1e-3)


def _flops(m: dict[str, float], counts: dict[str, int]) -> float | None:
    """Operations of one precision; None when none of its counters was given."""
    given = [(m[name], weight) for name, weight in counts.items() if name in m]
    return sum(value * weight for value, weight in given) if given else None


def _occupancy(m: dict[str, float]) -> OccupancyDigest:
    limits = {what: m.get(name) for what, name in OCCUPANCY_LIMITS.items()}
    known = {what: v for what, v in limits.items() if v is not None}
    fewest = min(known.values()) if known else None
    registers = m.get(REGISTERS)
    return OccupancyDigest(achieved_pct=m.get(ACHIEVED_OCCUPANCY), theoretical_pct=m.get(THEORETICAL_OCCUPANCY),
                           registers_per_thread=None if registers is None else int(registers),
                           limited_by=[what for what, v in known.items() if v == fewest],
                           blocks_per_sm_by_limit=limits)


def _top_stalls(m: dict[str, float]) -> list[Stall]:
    """The largest stall reasons (warps per issued instruction), each with its share of all reasons."""
    stalls = {r: m[STALL.format(r)] for r in STALL_REASONS if STALL.format(r) in m}
    # "selected" is the issuing warp itself, not a stall.
    stalls = {r: v for r, v in stalls.items() if r != "selected" and v > 0}
    total = sum(stalls.values())
    ranked = sorted(stalls.items(), key=lambda item: -item[1])[:TOP_STALLS]
    return [Stall(reason=r, warps_per_issue=v, share=v / total) for r, v in ranked]
