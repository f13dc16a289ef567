"""bench/timing.py's pure parts: reading Nsight Compute's CSV, judging the results against their targets and
writing the report's tables. No GPU."""

from __future__ import annotations

import statistics

from bench.direct import REPEATS, SETS
from harness.profile_digest import in_base_units, number, raw_rows

def protocol_rows(protocols: dict) -> list[str]:
    if not protocols.get("kernels"):
        return []
    lines = ["", f"fresh inputs (drawn on the device for every launch) against the rotated fixed sets, "
                 f"{protocols['rounds']} timings each, alternately",
             "| kernel | fresh (us) | rotated (us) | fresh / rotated | GPU busy per launch, fresh / rotated (us) "
             "| wall per launch, fresh / rotated (us) |", "|---|---|---|---|---|---|"]
    for k in protocols["kernels"]:
        fresh, rotated = k["fresh"], k["rotated"]
        busy = (f"{fresh['gpu_busy_us_per_launch']:.1f} / {rotated['gpu_busy_us_per_launch']:.1f}"
                if fresh["gpu_busy_us_per_launch"] and rotated["gpu_busy_us_per_launch"] else "—")
        lines.append(f"| {k['label']} | {fresh['median_ms'] * 1e3:.1f} | {rotated['median_ms'] * 1e3:.1f} | "
                     f"{k['ratio']:.4f} | {busy} | {fresh['wall_us_per_launch']:.0f} / "
                     f"{rotated['wall_us_per_launch']:.0f} |")
    return lines


def protocol_summary(runs: list[dict]) -> dict:
    """Median of the medians, and the busy and wall time per timed launch, over one protocol's runs."""
    launches = sum(r["launches"] for r in runs)
    busy = [r["gpu_busy_ms"] for r in runs]
    return {"median_ms": statistics.median(r["median_ms"] for r in runs),
            "gpu_busy_us_per_launch": sum(busy) * 1e3 / launches if None not in busy else None,
            "wall_us_per_launch": sum(r["wall_s"] for r in runs) * 1e6 / launches}


def _referee_floor(results: dict) -> float | None:
    """The empty kernel's reading on the referee's clock (the median over the bench's timings)."""
    floors = [k["kernel_floor_ms"] for k in results.get("kernels", []) if k.get("kernel_floor_ms")]
    return statistics.median(floors) if floors else None


def median_or_none(values: list) -> float | None:
    return statistics.median(values) if values and None not in values else None


def ncu_durations_ms(text: str) -> list[float]:
    """gpu__time_duration of every profiled launch, in launch order, from `ncu --csv` output."""
    return [in_base_units(number(row["Metric Value"]), row.get("Metric Unit") or "ns")
            for row in raw_rows(text) if row.get("Metric Name") == "gpu__time_duration.sum"]


def ncu_summary(values: list[float], labels: list[str]) -> dict | None:
    """ncu's values in bench/direct.py's launch order (an empty kernel REPEATS times, then for each
    kernel REPEATS rounds over the SETS input sets): the median of each kernel, of each of its sets,
    and the empty kernel's. None if the count is not that."""
    per_kernel = REPEATS * SETS
    if len(values) != REPEATS + per_kernel * len(labels):
        return None
    empty, values = values[:REPEATS], values[REPEATS:]
    mine = {label: values[i * per_kernel:(i + 1) * per_kernel] for i, label in enumerate(labels)}
    return {"empty_kernel_ms": statistics.median(empty), "sets": SETS, "repeats_per_set": REPEATS,
            "median_ms": {label: statistics.median(v) for label, v in mine.items()},
            # launches go round the sets: set s is every SETS-th value from s
            "per_set_ms": {label: [statistics.median(v[s::SETS]) for s in range(SETS)] for label, v in mine.items()}}


def ncu_combined(summaries: list[dict]) -> dict:
    """Several ncu passes as one: each kernel's (and the empty kernel's) median over the passes'
    medians, with each pass's median kept; the per-set medians are the first pass's."""
    if len(summaries) == 1:
        return summaries[0]
    per_pass = {label: [s["median_ms"][label] for s in summaries] for label in summaries[0]["median_ms"]}
    return {**summaries[0], "passes": len(summaries),
            "empty_kernel_ms": statistics.median(s["empty_kernel_ms"] for s in summaries),
            "median_ms": {label: statistics.median(v) for label, v in per_pass.items()}, "pass_medians_ms": per_pass}


def _ncu_passes(ncu: dict) -> list[str]:
    """ncu's own spread: each kernel's lowest and highest median over the bench's ncu passes."""
    passes = ncu.get("pass_medians_ms")
    if not passes:
        return []
    lines = ["", f"ncu's own spread over {ncu['passes']} passes (each the whole ncu step):",
             "| kernel | lowest (us) | highest (us) | spread |", "|---|---|---|---|"]
    for label, values in passes.items():
        low, high = min(values), max(values)
        lines.append(f"| {label} | {low * 1e3:.1f} | {high * 1e3:.1f} | {(high - low) / statistics.median(values):.2%} |")
    return lines


def _clock_steps(results: dict, ncu: dict) -> list[str]:
    """The kernel clock outside the referee, step by step, beside ncu (bench/direct.py clock)."""
    lines = []
    for key in ("clock", "clock_concurrent"):
        steps = results.get(key) or {}
        if not steps.get("median_ms"):
            if steps.get("note"):
                lines.append(f"\n{key}: {steps['note']}")
            continue
        names = list(next(iter(steps["median_ms"].values())))
        lines += ["", f"on the kernel clock outside the referee, {steps.get('tracing', 'serial')} tracing "
                      f"(an empty kernel reads {steps['empty_kernel_ms'] * 1e3:.2f} us):",
                  "| kernel | " + " | ".join(names) + " | ncu (us) |", "|---" * (len(names) + 2) + "|"]
        for label, medians in steps["median_ms"].items():
            theirs = ncu.get(label)
            lines.append(f"| {label} | " + " | ".join(f"{medians[n] * 1e3:.1f}" for n in names) + " | "
                         + (f"{theirs * 1e3:.1f} |" if theirs else "— |"))
    return lines


FIDELITY_FROM_MS, FIDELITY_WITHIN = 0.020, 0.02
REPEATABLE_FROM_MS, REPEATABLE_CV = 0.050, 0.005
# Fresh inputs must not move an honest kernel's median: within this of the rotated sets' from 50 us.
PROTOCOL_WITHIN = 0.01


def targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """(target, met or None where not measured, what was measured) for each of the bench's targets."""
    kernels = results.get("kernels", [])
    ncu = (results.get("ncu") or {}).get("median_ms", {})
    floor, ncu_floor = _referee_floor(results), (results.get("ncu") or {}).get("empty_kernel_ms")
    rows = []
    long = [(k, ncu[k["label"]]) for k in kernels if ncu.get(k["label"], 0) >= FIDELITY_FROM_MS]
    if long:
        raw = max(abs(k["median_ms"] / theirs - 1) for k, theirs in long)
        rows.append((f"within {FIDELITY_WITHIN:.0%} of ncu from {FIDELITY_FROM_MS * 1e3:.0f} us", raw <= FIDELITY_WITHIN,
                     f"at most {raw:.2%} off, over {len(long)} kernels"))
        if floor and ncu_floor:
            net = max(abs((k["median_ms"] - floor) / (theirs - ncu_floor) - 1) for k, theirs in long)
            rows.append(("the same, net of each clock's empty kernel", net <= FIDELITY_WITHIN, f"at most {net:.2%} off"))
    else:
        rows.append((f"within {FIDELITY_WITHIN:.0%} of ncu from {FIDELITY_FROM_MS * 1e3:.0f} us", None, "no ncu values"))
    steady = [k for k in kernels if k["median_ms"] >= REPEATABLE_FROM_MS]
    worst = max((k["cv"] for k in steady), default=None)
    rows.append((f"CV <= {REPEATABLE_CV:.1%} over runs from {REPEATABLE_FROM_MS * 1e3:.0f} us",
                 None if worst is None else worst <= REPEATABLE_CV,
                 "no kernel that long" if worst is None else f"at most {worst:.2%}, over {len(steady)} kernels"))
    if d := results.get("discrimination"):
        rows.append(("a 2% slower copy slower beyond noise in >= 19 of 20, never faster",
                     d["slower_beyond_noise"] >= 0.95 * d["trials"] and d["slower_wrongly_faster"] == 0,
                     f"{d['slower_beyond_noise']} of {d['trials']}, wrongly faster {d['slower_wrongly_faster']}"))
        rows.append(("A/A: no false claim", d["aa_false_claims"] == 0, f"{d['aa_false_claims']} of {d['trials']}"))
    steady = [k for k in (results.get("protocols") or {}).get("kernels", [])
              if k["rotated"]["median_ms"] >= REPEATABLE_FROM_MS]
    if steady:
        worst = max(abs(k["ratio"] - 1) for k in steady)
        rows.append((f"fresh inputs within {PROTOCOL_WITHIN:.0%} of the rotated sets from "
                     f"{REPEATABLE_FROM_MS * 1e3:.0f} us", worst <= PROTOCOL_WITHIN,
                     f"at most {worst:.2%} apart, over {len(steady)} kernels"))
    if o := results.get("overhead"):
        rows.append(("record_attempt <= compile + 1.3 x GPU busy + 0.3 s", o["record_attempt_wall_s"] <= o["bound_s"],
                     f"{o['record_attempt_wall_s']:.2f} s against {o['bound_s']:.2f} s"))
    return rows


def report(results: dict) -> str:
    clocks = {k.get("clock", "events") for k in results.get("kernels", [])}
    lines = [f"the referee's clock: {', '.join(sorted(clocks)) or '—'}",
             "| kernel | referee median (us) | CV over runs | its events (us) | ncu (us) | vs ncu | do_bench (us) | vs do_bench |",
             "|---|---|---|---|---|---|---|---|"]
    ncu = (results.get("ncu") or {}).get("median_ms", {})
    triton = (results.get("triton") or {}).get("median_ms", {})
    for k in results.get("kernels", []):
        ours = k["median_ms"]
        theirs = [ncu.get(k["label"]), triton.get(k["label"])]
        cells = []
        for value in theirs:
            cells += [f"{value * 1e3:.1f}", f"{ours / value - 1:+.2%}"] if value else ["—", "—"]
        events = f"{k['event_median_ms'] * 1e3:.1f}" if k.get("event_median_ms") else "—"
        lines.append(f"| {k['label']} | {ours * 1e3:.1f} | {k['cv']:.2%} | {events} | " + " | ".join(cells) + " |")
    floor, ncu_floor = _referee_floor(results), (results.get("ncu") or {}).get("empty_kernel_ms")
    if floor and ncu_floor and ncu:
        lines += ["", f"net of each clock's empty kernel (the referee's {floor * 1e3:.2f} us, ncu's "
                      f"{ncu_floor * 1e3:.2f} us): what the kernel adds to an empty launch on each",
                  "| kernel | referee net (us) | ncu net (us) | vs ncu |", "|---|---|---|---|"]
        for k in results.get("kernels", []):
            if (theirs := ncu.get(k["label"])) is not None:
                ours_net, theirs_net = k["median_ms"] - floor, theirs - ncu_floor
                lines.append(f"| {k['label']} | {ours_net * 1e3:.1f} | {theirs_net * 1e3:.1f} | "
                             f"{ours_net / theirs_net - 1:+.2%} |")
    for section in ("ncu", "triton"):
        if note := (results.get(section) or {}).get("note"):
            lines.append(f"\n{section}: {note}")
    if (empty := (results.get("ncu") or {}).get("empty_kernel_ms")) is not None:
        lines.append(f"\nncu reads an empty kernel at {empty * 1e3:.2f} us")
    lines += _ncu_passes(results.get("ncu") or {})
    lines += _clock_steps(results, ncu)
    lines += protocol_rows(results.get("protocols") or {})
    lines += _flush_rows(results.get("flush") or {}, ncu)
    lines += _discrimination_and_overhead(results)
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'—' if met is None else ('yes' if met else 'no')} | {what} |"
              for name, met, what in targets(results)]
    return "\n".join(lines)


def _flush_rows(flush: dict, ncu: dict) -> list[str]:
    lines: list[str] = []
    if flush.get("median_ms"):
        lines += ["", f"by CUDA events, after each flush (an empty kernel reads {flush['empty_kernel_ms'] * 1e3:.2f} us):",
                  "| kernel | read flush (us) | memset flush (us) | no flush (us) | ncu (us) |", "|---|---|---|---|---|"]
        for label, ways in flush["median_ms"].items():
            theirs = ncu.get(label)
            lines.append(f"| {label} | {ways['read'] * 1e3:.1f} | {ways['memset'] * 1e3:.1f} | {ways['none'] * 1e3:.1f} | "
                         + (f"{theirs * 1e3:.1f} |" if theirs else "— |"))
    elif flush.get("note"):
        lines.append(f"\nflush: {flush['note']}")
    return lines


def _discrimination_and_overhead(results: dict) -> list[str]:
    lines: list[str] = []
    d = results.get("discrimination")
    if d:
        lines.append(f"\ndiscrimination on {d['case']['name']}: the 2%-slower copy (median ratio "
                     f"{d['slower_ratio_median']:.4f}) ranked slower in {d['slower_ranked_slower']}/{d['trials']}, "
                     f"slower beyond noise in {d['slower_beyond_noise']}/{d['trials']}, "
                     f"wrongly faster in {d['slower_wrongly_faster']}/{d['trials']}; "
                     f"A/A false claims {d['aa_false_claims']}/{d['trials']} "
                     f"(ratios {d['aa_ratio_spread'][0]:.4f} to {d['aa_ratio_spread'][1]:.4f})")
    o = results.get("overhead")
    if o:
        lines.append(f"overhead: record_attempt {o['record_attempt_wall_s']:.2f} s ({o['verdict']}) against the bound "
                     f"compile + 1.3 x GPU busy ({o.get('gpu_busy_source', 'timed launches')}) + 0.3 s = "
                     f"{o['compile_s']:.2f} + 1.3 x {o['gpu_busy_s']:.2f} + 0.3 = "
                     f"{o['bound_s']:.2f} s; host time {o['host_s']:.2f} s; worker cold start "
                     f"{o['worker_cold_start_s']:.2f} s; compile {o['compile_ms']:.0f} ms, cache hit {o['cache_hit_ms']:.1f} ms")
        calls = o.get("executor_calls") or {}
        if calls:
            lines.append("record_attempt's executor calls: " + ", ".join(
                f"{name} {c['calls']} in {c['wall_s']:.2f} s" for name, c in calls.items()))
    return lines
