"""The timing shape's thresholds (harness/timing_shape.py) against honest kernels' launches measured on a GPU
(bench/spreads.py, recorded under bench/recorded/): none of them is refused, each with room to spare."""

import json
from pathlib import Path

import pytest

from harness.timing_shape import MODE_GAP, shape_of, shape_reasons

RECORDED = sorted(Path(__file__).resolve().parents[1].glob("bench/recorded/*/spreads.json"))
# A kernel refused for its outputs is no honest kernel (a reference timed under a launch it does not cover, which
# bench/spreads.py has since left out): its launches say nothing of honest spreads. Any other refusal stays in.
OUTPUT_CODES = {"unwritten_output", "timed_output_mismatch"}
ROWS = [(path.parent.name, row) for path in RECORDED for row in json.loads(path.read_text())["rows"]
        if not OUTPUT_CODES & set(row["reasons"])]


def test_honest_spreads_are_recorded():
    assert len(ROWS) >= 30


@pytest.mark.parametrize("where,row", ROWS, ids=[f"{w}-{r['kernel']}-{r['case']}-{r['run']}" for w, r in ROWS])
def test_no_recorded_honest_timing_is_refused_for_its_shape(where, row):
    shape = shape_of(row["samples_ms"])
    assert shape_reasons(shape, row["case"]) == [], (where, row["kernel"], shape)
    # Room to spare: half the allowed spread, a third of the gap that makes two modes
    assert shape.spread <= shape.spread_allowed / 2, shape
    assert shape.middle_spread <= shape.middle_spread_allowed / 2, shape
    assert shape.mode_gap < MODE_GAP / 3, shape
