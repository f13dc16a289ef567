"""The cost sheet's formulas and the `cost` command on a real run folder."""

import json

import pytest

from server.cli import main
from server.cost import CostInputs, cost_sheet
from tests.server_support import new_run

INPUTS = CostInputs(engineer_hours=8, hourly_rate=150, model_cost=40, gpu_hour_cost=4,
                    invocations_per_month=50_000_000, ms_saved_end_to_end=0.36)


def test_the_formulas():
    sheet = cost_sheet(INPUTS, run_wall_hours=0.5, run_gpu_busy_hours=0.01)
    assert sheet.engineering_cost == 1200 and sheet.gpu_cost == 2.0
    assert sheet.pilot_cost == pytest.approx(1242.0)
    assert sheet.saved_gpu_hours_per_month == pytest.approx(0.36 * 50_000_000 / 3_600_000)  # 5 h
    assert sheet.monthly_saving == pytest.approx(20.0)
    assert sheet.payback_months == pytest.approx(1242.0 / 20.0)


def test_nothing_saved_never_pays_back():
    sheet = cost_sheet(INPUTS.model_copy(update={"ms_saved_end_to_end": 0}), 0.5, 0.01)
    assert sheet.monthly_saving == 0 and sheet.payback_months is None


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError):
        CostInputs(**{**INPUTS.model_dump(), "hourly_rate": -1})


def test_the_command_uses_the_runs_own_time(tmp_path, capsys):
    run = new_run(tmp_path)
    summary = json.loads((run.dir / "summary.json").read_text())
    run.close()
    args = ["cost", str(run.dir), "--engineer-hours", "8", "--hourly-rate", "150", "--model-cost", "40",
            "--gpu-hour-cost", "4", "--invocations-per-month", "50000000", "--ms-saved-end-to-end", "0.36"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "payback" in out and "END TO END" in out and "5.0000" in out
    assert f"{summary['gpu_seconds'] / 3600:.4f} h busy" in out
