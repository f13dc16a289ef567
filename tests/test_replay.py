"""`kernel-referee replay` on CPU: runs made by the real run logic with the fake executor, replayed with a fake."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from harness.device import gpu_absent_reason
from harness.gpu_lease import LEASE_DIR_ENV, ServingClaim
from harness.placement import GpuInfo
from harness.task import load_task
from server.attempt import finish, record_attempt
from server.verify import verify_run
from server.cli import main
from server import replay as replay_module
from server.replay import replay
from server.report_files import write_report
from tests.fake_executor import FAKE_GPU_UUID, H200_ENVIRONMENT, FakeExecutor, Fp16TensorCoreToolchain
from tests.report_support import Page
from tests.server_support import HOLDOUT, VISIBLE, kernel, new_run, read_json

no_gpu = pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU")


def make_run(tmp_path: Path, *sources: str, executor_options: dict | None = None) -> Path:
    """A finished run whose attempts are `sources`, in order."""
    run = new_run(tmp_path, executor_options)
    try:
        for number, source in enumerate(sources, start=1):
            record_attempt(run, run.candidate(None, source), f"try {number}", None, None)
        finish(run, "done", None)
        return run.dir
    finally:
        run.close()


def fake(task, timing, gpu: str = "Fake GPU"):
    return FakeExecutor(task, gpu=gpu)


class HoldoutFailsHere(FakeExecutor):
    """This GPU gets the holdout cases wrong for every kernel (a best that fails a holdout on replay)."""

    def _source(self, kernel):
        return super()._source(kernel) + "\n// fake: wrong-holdout\n"


class TwoPacedHere(FakeExecutor):
    """Every kernel with a latency marker (the run's best, not the baseline) runs at two paces on this GPU."""

    def _source(self, kernel):
        source = super()._source(kernel)
        return source + "\n// fake: two-paced\n" if "latency_us" in source else source


class BreaksDuringTiming(FakeExecutor):
    def time(self, kernel, cases):
        raise RuntimeError("worker error on case square-256: the driver went away")


def replayed(run_dir: Path, make_executor=fake, **options) -> tuple[int, dict, str]:
    out = io.StringIO()
    code = replay(run_dir, out, make_executor=make_executor, **options)
    name = "replay.json" if options.get("attempt") is None else f"replay-attempt-{options['attempt']:03d}.json"
    document = read_json(run_dir / name) if (run_dir / name).exists() else None
    return code, document, out.getvalue()


@pytest.fixture
def good_run(tmp_path) -> Path:
    return make_run(tmp_path, kernel("latency_us=50"))


def test_a_good_run_replays_to_go_and_still_verifies(good_run):
    log_before = (good_run / "events.jsonl").read_bytes()
    code, document, out = replayed(good_run, repeats=2)
    assert code == 0, out
    assert document["decision"] == "GO" and document["reasons"][0].startswith("all ")
    assert (document["run"], document["task"], document["run_status"]) == ("run-001", "matmul_f32", "finished")
    assert document["kernel"]["attempt"] == 1 and document["kernel"]["is_best"] is True
    assert document["kernel"]["source_sha256"] == read_json(good_run / "history.json")["attempts"][1]["source_sha256"]
    assert document["baseline"]["attempt"] == 0 and document["baseline"]["source_file"] == "attempts/000.cu"
    names = [c["name"] for c in document["checks"]]
    assert names == ([f"replay best-case-{i}.json ({case})" for i, case in enumerate(VISIBLE)]
                     + [f"holdout {HOLDOUT}", f"holdout-oracle {HOLDOUT}"]
                     + [f"fresh-oracle {case}" for case in VISIBLE + [HOLDOUT]])
    assert all(c["passed"] for c in document["checks"])
    fresh = [c for c in document["checks"] if c["kind"] == "fresh-oracle"]
    run_seeds = {c.name: c.seed for c in load_task(good_run / "task").cases}
    assert all(c["against"] == "oracle" and c["seed"] != run_seeds[c["case"]] for c in fresh)
    assert [r["repeat"] for r in document["repeats"]] == [1, 2]
    for r in document["repeats"]:
        assert r["speedup"]["beyond_noise"] and r["speedup"]["ratio"] == pytest.approx(2.0, rel=0.02)
        assert sorted(r["cases"]) == sorted(r["stats"]["candidate"]) == ["rect-2000x1500x1000", "square-2048"]
        assert len(r["samples_ms"]["baseline"]["square-2048"]) == 2 * 50  # two interleaved rounds of 50
    assert document["environment"]["differences"] == [] and document["environment"]["now"]["gpu"] == "Fake GPU"
    assert document["run_chain_head"] == verify_run(good_run).head
    assert "GO" in out and "checks: 9 of 9 passed" in out and "repeat 2: 2" in out
    assert (good_run / "events.jsonl").read_bytes() == log_before  # the audit log is left alone
    report = verify_run(good_run)
    assert report.ok, report.problems


def test_a_disqualified_attempt_replays_to_no_go_naming_the_holdout_case(tmp_path):
    run_dir = make_run(tmp_path, kernel("latency_us=40", "wrong-holdout"), kernel("latency_us=70"))
    assert (read_json(run_dir / "summary.json")["best_attempt"], read_json(run_dir / "summary.json")["disqualified"]) \
        == (2, [1])
    code, document, out = replayed(run_dir, attempt=1, repeats=1)
    assert code == 1
    assert document["decision"] == "NO-GO" and document["kernel"]["attempt"] == 1
    assert document["kernel"]["is_best"] is False
    assert [r.split(" failed:")[0] for r in document["reasons"]] == [
        f"holdout {HOLDOUT}", f"holdout-oracle {HOLDOUT}", f"fresh-oracle {HOLDOUT}"]
    assert all("mismatch" in r for r in document["reasons"])
    assert [c["name"] for c in document["checks"] if c["kind"] == "replay"] == [f"replay {c}" for c in VISIBLE]
    assert document["repeats"][0]["speedup"]["ratio"] == pytest.approx(2.5, rel=0.02)
    assert f"FAIL holdout {HOLDOUT}: mismatch" in out and "NO-GO" in out
    assert not (run_dir / "replay.json").exists()  # the best's replay is another file
    assert replayed(run_dir)[0] == 0  # the attempt that replaced it replays to GO
    assert verify_run(run_dir).ok


def test_a_best_that_fails_the_holdout_on_this_gpu_is_no_go(good_run):
    code, document, _ = replayed(good_run, lambda task, timing: HoldoutFailsHere(task))
    assert code == 1
    assert any(r.startswith(f"holdout {HOLDOUT} failed: mismatch") for r in document["reasons"])
    assert not any(r.startswith("replay") for r in document["reasons"])  # the visible cases still pass


def test_another_gpu_is_no_go_naming_the_field(good_run):
    code, document, out = replayed(good_run, lambda task, timing: fake(task, timing, gpu="Other GPU"))
    assert code == 1
    assert document["reasons"] == ["environment differs from the run's: gpu: run 'Fake GPU', now 'Other GPU'"]
    assert document["environment"]["differences"] == [{"field": "gpu", "run": "Fake GPU", "now": "Other GPU"}]
    assert "environment: differs from the run's: gpu 'Fake GPU' -> 'Other GPU'" in out


def test_a_best_re_timed_beyond_the_physical_limit_is_no_go_naming_it(good_run):
    # The run's fake knew only a memory peak; on an H200 the best's 50 us is 344 TFLOP/s of fp32 on square-2048.
    code, document, out = replayed(good_run, lambda task, timing: FakeExecutor(task, environment=H200_ENVIRONMENT),
                                   repeats=2)
    assert code == 1 and document["decision"] == "NO-GO"
    limit = [r for r in document["reasons"] if "beyond_physical_limit" in r]
    assert [r.split(" failed:")[0] for r in limit] == [
        f"physical limit {case} (repeat {n})" for n in (1, 2) for case in ("square-2048", "rect-2000x1500x1000")]
    assert "beyond_physical_limit: square-2048: " in limit[0] and "TFLOP/s of fp32" in limit[0]
    assert "66.9 TFLOP/s peak (theoretical; measured 51.0)" in limit[0]
    assert [r for r in document["reasons"] if r not in limit] == []  # every other check holds, and it is faster
    assert all(c["passed"] for c in document["checks"] if c["kind"] != "physical-limit")
    assert document["repeats"][0]["physical_limit"]["peaks"]["fp32"]["measured"] == 51.0
    assert "FAIL physical limit square-2048 (repeat 1): beyond_physical_limit" in out


def test_a_best_within_the_physical_limit_still_replays_to_go(tmp_path):
    slow = {"default_latency_us": 5000}  # a 5 ms baseline; the best at 400 us is 42.9 TFLOP/s, within an H200's 66.9
    run_dir = make_run(tmp_path, kernel("latency_us=400"), executor_options=slow)
    code, document, out = replayed(run_dir, lambda task, timing: FakeExecutor(task, environment=H200_ENVIRONMENT, **slow),
                                   repeats=2)
    assert code == 0, out
    assert not any(c["beyond"] for r in document["repeats"] for c in r["physical_limit"]["cases"])


def test_a_best_that_is_the_baseline_is_exempt_from_the_physical_limit(tmp_path):
    run_dir = make_run(tmp_path)  # its 100 us on square-2048 would be 172 TFLOP/s: the task's own kernel is exempt
    _, document, _ = replayed(run_dir, lambda task, timing: FakeExecutor(task, environment=H200_ENVIRONMENT))
    assert document["kernel"]["attempt"] == 0
    assert not any(c["kind"] == "physical-limit" for c in document["checks"])
    assert not any("physical_limit" in r for r in document["repeats"])


def test_a_best_computing_on_units_its_task_forbids_is_no_go_before_any_timing(good_run):
    code, document, out = replayed(good_run, lambda task, timing: Fp16TensorCoreToolchain(task))
    assert code == 1 and document["decision"] == "NO-GO"
    refused = [c for c in document["checks"] if c["kind"] == "arithmetic"]
    assert len(refused) == 1 and not refused[0]["passed"]
    assert refused[0]["reasons"][0].startswith("arithmetic_not_allowed: the kernel's SASS holds 3 fp16 tensor-core MMA")
    assert document["repeats"] == []  # refused before it was timed, as a run refuses it


def test_a_best_that_is_the_task_s_own_kernel_is_exempt_from_the_arithmetic(tmp_path):
    run_dir = make_run(tmp_path)
    _, document, _ = replayed(run_dir, lambda task, timing: Fp16TensorCoreToolchain(task))
    assert not any(c["kind"] == "arithmetic" for c in document["checks"])


def test_a_best_that_is_the_baseline_is_no_go_for_every_repeat(tmp_path):
    run_dir = make_run(tmp_path)
    code, document, _ = replayed(run_dir, repeats=2)
    assert code == 1
    assert [r.split(":")[0] for r in document["reasons"]] == ["repeat 1", "repeat 2"]
    assert all("is within noise, where GO needs faster beyond noise" in r for r in document["reasons"])


def test_a_baseline_at_two_paces_is_timed_as_measured_and_a_best_at_two_paces_is_no_go(tmp_path):
    two_paced = lambda task, timing: FakeExecutor(task, two_paced_baseline=True)  # noqa: E731
    code, document, out = replayed(make_run(tmp_path / "a", kernel("latency_us=50")), two_paced, repeats=1)
    assert code == 0 and document["decision"] == "GO", out
    waived = document["repeats"][0]["shape_waived"]  # the baseline's shape, taken past, is on the record
    assert "the baseline's timing taken as measured though its launches' shape was refused" in out
    assert list(waived) == ["baseline"] and all(r.startswith("timing_modes: ") for rs in waived["baseline"].values()
                                                for r in rs)
    code, document, _ = replayed(make_run(tmp_path / "b", kernel("latency_us=50")),
                                 lambda task, timing: TwoPacedHere(task), repeats=1)
    assert code == 1 and "the candidate failed its timing: timing_modes" in document["reasons"][0]
    _, document, _ = replayed(make_run(tmp_path / "c"), two_paced, repeats=1)  # the best is the task's own kernel
    assert document["repeats"][0]["speedup"] and "timing_modes" not in json.dumps(document["reasons"])
    assert set(document["repeats"][0]["shape_waived"]) == {"baseline", "candidate"}  # both the task's own kernel


def test_a_failure_inside_the_referee_is_no_go_and_keeps_what_was_checked(good_run):
    code, document, _ = replayed(good_run, lambda task, timing: BreaksDuringTiming(task))
    assert code == 1
    first, last = document["reasons"]
    assert first == ("referee failed: the replay could not complete: RuntimeError: worker error on case "
                     "square-256: the driver went away")
    assert last == "no timing repeat was made"
    assert len(document["checks"]) == 10 and all(c["passed"] for c in document["checks"][:9])
    assert document["repeats"] == []


def test_a_tampered_run_is_refused_before_anything_runs(good_run, capsys):
    history = good_run / "history.json"
    history.write_text(history.read_text().replace('"valid-faster"', '"baseline"'))
    assert main(["replay", str(good_run)]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1  # one line, on stderr
    assert said.err.startswith(f"kernel-referee replay: refused: {good_run} does not verify (history.json: sha256 "
                               "differs from the last recorded write")
    assert not (good_run / "replay.json").exists()


def test_bad_arguments_are_exit_2(good_run, capsys):
    assert replay(good_run, io.StringIO(), repeats=0, make_executor=fake) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err
    out = io.StringIO()
    assert replay(good_run, out, attempt=99, make_executor=fake) == 2
    assert "history.json has no attempt 99 (it has [0, 1])" in capsys.readouterr().err
    assert main(["replay", str(good_run.parent / "run-404")]) == 2
    assert not list(good_run.glob("replay*.json"))


@no_gpu
def test_without_a_gpu_the_folder_is_verified_and_replay_says_it_needs_one(good_run, capsys):
    assert main(["replay", str(good_run)]) == 3
    said = capsys.readouterr()
    assert f"{good_run}: verified (" in said.out
    assert "replay needs an NVIDIA GPU: " in said.err and "nothing was replayed" in said.err
    assert not (good_run / "replay.json").exists()


def test_a_replay_writes_the_report_again_with_its_decision(good_run):
    write_report(good_run)
    assert "No replay.json yet" in (good_run / "report.html").read_text()
    code, _, out = replayed(good_run, repeats=1)
    assert code == 0 and f"wrote {good_run / 'report.html'} again" in out
    page = Page((good_run / "report.html").read_text()).text
    assert "No replay.json yet" not in page and "decision GO" in page
    assert verify_run(good_run).ok


def test_replay_json_is_strict_json(good_run):
    replayed(good_run, repeats=1)
    text = (good_run / "replay.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in replay.json"))


def test_an_attempt_prepares_the_inputs_of_the_very_secret_seeds_its_fresh_check_uses(tmp_path):
    from tests.server_support import kernel, new_run

    run = new_run(tmp_path)
    try:
        record_attempt(run, run.candidate(None, kernel("latency_us=80")), "faster", None, None)
        fake = run.executor
        assert len(fake.prepared) == 1 and set(fake.prepared[0]) == {c.name for c in run.task.visible_cases}
        assert fake.checked_seeds[-1] == fake.prepared[0]  # the fresh check, on the prepared seeds
        assert run.history[-1].validation["fresh"]["seeds"] == fake.prepared[0]
    finally:
        run.close()


def test_a_replay_on_this_hosts_gpu_lets_its_serving_claim_go_when_it_ends(good_run, tmp_path, monkeypatch):
    """`replay` without an executor places itself on a GPU and claims it; once it returns, a server or a service
    in the same host (or the same process, as `approve` runs it) finds that GPU free again."""
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    gpu = GpuInfo(0, FAKE_GPU_UUID, 80 << 30)
    probe = ServingClaim(gpu.uuid, "probe")
    claimed_during: list[bool] = []

    def placed_executor(task, timing, *, gpu, **_):
        claimed_during.append(probe.is_taken())
        return FakeExecutor(task, placed=gpu)

    monkeypatch.setattr(replay_module, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(replay_module, "list_gpus", lambda: [gpu])
    monkeypatch.setattr(replay_module, "GpuExecutor", placed_executor)
    code, document, out = replayed(good_run, make_executor=None, repeats=1)
    assert code == 0 and document["decision"] == "GO", out
    assert claimed_during and all(claimed_during), claimed_during
    assert not probe.is_taken()


def test_a_replay_that_fails_inside_still_lets_its_serving_claim_go(good_run, tmp_path, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    gpu = GpuInfo(0, FAKE_GPU_UUID, 80 << 30)
    monkeypatch.setattr(replay_module, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(replay_module, "list_gpus", lambda: [gpu])
    monkeypatch.setattr(replay_module, "replay_run", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        replay(good_run, io.StringIO())
    assert not ServingClaim(gpu.uuid, "probe").is_taken()
