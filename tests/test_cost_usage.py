"""`kernel-referee cost` without --model-cost takes the model charges the client recorded with its attempts
(`usage.cost_usd` in history.json), and says so; with none recorded it asks for --model-cost in one line."""

from __future__ import annotations

import anyio

from server.cli import main
from tests.server_support import client, kernel, new_run, ok

COST = ["--engineer-hours", "8", "--hourly-rate", "150", "--gpu-hour-cost", "4", "--invocations-per-month",
        "50000000", "--ms-saved-end-to-end", "0.36"]


def run_with_usages(tmp_path, usages: list[dict | None]):
    run = new_run(tmp_path)

    async def drive() -> None:
        async with client(run) as c:
            for i, usage in enumerate(usages):
                await ok(c, "record_attempt", source=kernel(f"latency_us={60 - i}"), rationale=f"try {i}",
                         **({"usage": usage} if usage is not None else {}))

    try:
        anyio.run(drive, backend="asyncio")
    finally:
        run.close()
    return run.dir


def test_the_model_cost_defaults_to_the_recorded_usage(tmp_path, capsys):
    run_dir = run_with_usages(tmp_path, [{"cost_usd": 0.25, "model": "m"}, {"input_tokens": 10}, {"cost_usd": 0.5}])
    assert main(["cost", str(run_dir), *COST]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model cost 0.75: the usage.cost_usd recorded with 2 of 3 attempt(s)")
    assert "+ model 0.75 +" in out


def test_a_given_model_cost_wins_over_the_recorded_one(tmp_path, capsys):
    run_dir = run_with_usages(tmp_path, [{"cost_usd": 0.25}])
    assert main(["cost", str(run_dir), *COST, "--model-cost", "40"]) == 0
    out = capsys.readouterr().out
    assert "+ model 40.00 +" in out and "usage.cost_usd" not in out


def test_without_any_recorded_cost_the_model_cost_is_asked_for(tmp_path, capsys):
    run_dir = run_with_usages(tmp_path, [None, {"calls": 3}])
    assert main(["cost", str(run_dir), *COST]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"kernel-referee cost: --model-cost is needed: no attempt of {run_dir} recorded usage.cost_usd"]
