"""`guard STORE --ray`: four approvals fanned out over a local Ray cluster of two workers, a custom resource
standing in for the GPUs and the fake executor for the GPU side; the results merged into one run."""

from __future__ import annotations

import io
import json
import os

import pytest

from guard.run import GuardOptions, finish, guard_results, run_guard
from guard.store import load_store
from guard.verdict import Verdict, VerdictSettings
from tests.fake_executor import FakeExecutor
from tests.guard_fake_store import add_approval, new_store

ray = pytest.importorskip("ray", reason="Ray is the optional extra kernel-referee[fleet]: not installed here")

FAKE_GPUS = {"fake_gpu": 2}  # two stand-in GPUs: two tasks at a time, on two workers
QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)


@pytest.fixture(scope="module")
def cluster():
    # Two CPUs and no dashboard: this machine is small and shared. Workers import the project from the checkout.
    # Ray refuses to store objects on a disk fuller than 95%, as a shared test machine's often is: these tests
    # store only small results.
    ray.init(num_cpus=2, resources=FAKE_GPUS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}},
             _system_config={"local_fs_capacity_threshold": 0.999})
    try:
        yield
    finally:
        ray.shutdown()


class Recorded(FakeExecutor):
    """The fake executor, saying which worker process ran it (in the node's fingerprint's place: its GPU name)."""

    def start(self) -> dict:
        return {**super().start(), "gpu": f"Fake GPU in pid {os.getpid()}"}


def recorded(approval):
    return lambda task, timing: Recorded(task)


def test_four_approvals_over_two_workers_merge_into_one_result(tmp_path, cluster):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    add_approval(store, key, "matmul-slower", "matmul_f32", 50, now_us=51.5)
    add_approval(store, key, "softmax", "softmax_f32", 40)
    add_approval(store, key, "softmax-wrong", "softmax_f32", 40, marker="wrong-fresh")
    out = io.StringIO()
    options = GuardOptions(store=store, ray="auto", make_executor=recorded, settings=QUICK,
                           json=tmp_path / "out" / "guard.json", junit=tmp_path / "out" / "guard.xml",
                           fleet_resources={"num_cpus": 1, "resources": {"fake_gpu": 1}})
    results = guard_results(options, load_store(store))
    assert finish(options, load_store(store), results, out) == 1, out.getvalue()
    assert [r.approval for r in results] == ["matmul", "matmul-slower", "softmax", "softmax-wrong"]
    verdicts = {r.approval: {v.verdict for v in r.verdicts} for r in results}
    assert verdicts == {"matmul": {Verdict.PASS}, "matmul-slower": {Verdict.REGRESSED}, "softmax": {Verdict.PASS},
                        "softmax-wrong": {Verdict.INCORRECT}}
    workers = {r.fingerprint.gpu for r in results}
    assert len(workers) >= 2 and all(w.startswith("Fake GPU in pid ") for w in workers)
    assert f"Fake GPU in pid {os.getpid()}" not in workers  # measured on the workers, not here
    text = out.getvalue()
    assert text.count(": pass, ") == 4 and text.count(": regressed, ") == 2 and text.count(": incorrect: ") == 2
    merged = json.loads((tmp_path / "out" / "guard.json").read_text())
    assert [r["approval"] for r in merged["results"]] == [r.approval for r in results]
    assert merged["counts"] == {"pass": 4, "regressed": 2, "improved": 0, "incorrect": 2, "inconclusive": 0}
    suite = (tmp_path / "out" / "guard.xml").read_text()
    assert suite.count("<testcase ") == 8 and suite.count("<failure ") == 4
    load_store(store)  # the store the nodes got copies of is as it was: it still verifies


def test_a_cluster_without_the_resource_asked_for_is_no_gpu(tmp_path, cluster):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    options = GuardOptions(store=store, ray="auto", make_executor=recorded, settings=QUICK,
                           fleet_resources={"num_gpus": 1})
    assert run_guard(options, io.StringIO()) == 3
