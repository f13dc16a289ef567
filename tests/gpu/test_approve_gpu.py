"""`kernel-referee approve` on the GPU: a real run's best, replayed on this GPU by approve itself, its accepted ratio
measured here in interleaved rounds, approved into a store that verifies, with the GPU's fingerprint."""

from __future__ import annotations

import json
import shutil

import pytest

from guard.cli import main
from guard.signing import generate
from guard.store import keys_dir, load_store
from server.verify import verify_run
from tests.gpu.test_replay import run_dir  # noqa: F401 - the fixture: a real finished run of matmul_f32

pytestmark = pytest.mark.gpu


def test_approve_replays_a_real_runs_best_on_this_gpu_and_signs_an_approval_that_verifies(run_dir, tmp_path,  # noqa: F811
                                                                                          capsys):
    private, public, key_id = generate(tmp_path / "keys")
    store = tmp_path / "store"
    keys_dir(store).mkdir(parents=True)
    shutil.copy(public, keys_dir(store))
    (run_dir / "replay.json").unlink(missing_ok=True)  # approve makes its own replay on this GPU
    code = main(["approve", str(run_dir), "--store", str(store), "--name", "matmul-tiled", "--key", str(private),
                 "--repeats", "2", "--ratio-rounds", "8", "--note", "the shipped tiled kernel"])
    out, err = capsys.readouterr()
    assert code == 0, err
    [loaded] = load_store(store)
    approval, lock = loaded.approval, json.loads((run_dir / "lock.json").read_text())
    assert loaded.key_id == key_id and approval.kernel.attempt == 1
    assert approval.provenance.replay.decision == "GO" and not approval.provenance.forced
    assert approval.provenance.replay.gpu == lock["environment"]["gpu"]
    assert approval.provenance.chain_head == verify_run(run_dir).head and verify_run(run_dir).ok
    fingerprint = approval.fingerprint
    assert fingerprint.gpu == lock["environment"]["gpu"] and fingerprint.gpu_uuid == lock["environment"]["gpu_uuid"]
    assert fingerprint.sm_count == lock["environment"]["sm_count"] and fingerprint.driver == lock["environment"]["driver"]
    assert fingerprint.power_limit_w and fingerprint.max_sm_clock_mhz and fingerprint.ecc_enabled in (True, False)
    assert [c.case for c in approval.cases] == ["rect-2000x1500x1000", "square-2048"]
    assert all(c.speedup.ratio > 1 and c.speedup.beyond_noise and c.samples_ms and c.kernel.n > 0
               for c in approval.cases)
    assert "approved attempt 1" in out
    # The accepted ratio, measured on this GPU as the guard measures: 8 rounds kept per case (none set aside on a
    # GPU the test has to itself), near the run's own ratio, its interval counting the shift between jobs.
    measured = approval.ratio_measurement
    assert measured.source == "guard-rounds" and measured.rounds == 8 and measured.gpu == lock["environment"]["gpu"]
    for case in approval.cases:
        ratio = case.ratio
        assert ratio.rounds == 8 and ratio.low <= ratio.estimate <= ratio.high, ratio
        assert ratio.estimate == pytest.approx(1.0 / case.speedup.ratio, rel=0.05), (ratio, case.speedup)
    assert out.count("over 8 rounds") == 2
