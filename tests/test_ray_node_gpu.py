"""The GPU a run's Ray actor uses on its node (service/ray_node.py `take_gpu`): a resumed run's recorded GPU whatever
id Ray handed the actor, where its serving claim is free, and a clear refusal where it is not; a new run's actor
never shares a GPU whose claim a resumed run holds while another of the node's is free. No Ray needed."""

from __future__ import annotations

import os

import pytest

from harness.gpu_lease import ServingClaim
from service.ray_node import GpuNotFree, take_gpu
from tests.fake_executor import fake_gpus

GPUS = fake_gpus(4)


@pytest.fixture(autouse=True)
def _own_claims(own_gpu_claims):
    """Each test's claims in its own folder (tests/conftest.py)."""


def test_a_resumed_run_uses_its_recorded_gpu_whatever_id_ray_handed_it():
    gpu, claim = take_gpu(GPUS, ["0"], "resumed", recorded=GPUS[2].uuid.upper())
    try:
        assert gpu == GPUS[2] and claim is not None and claim.held
        assert ServingClaim(GPUS[2].uuid, "a new run").is_taken()  # held: no other run takes it
    finally:
        claim.release()


def test_a_recorded_gpu_held_by_another_process_is_refused_naming_the_holder():
    other = ServingClaim(GPUS[1].uuid, "serve by hand")
    assert other.try_take()
    try:
        with pytest.raises(GpuNotFree, match=rf"GPU 1 .*held by another process \(pid {os.getpid()}: serve by hand\)"):
            take_gpu(GPUS, ["1"], "resumed", recorded=GPUS[1].uuid)
    finally:
        other.release()


def test_a_recorded_gpu_the_node_lists_no_more_is_refused():
    with pytest.raises(GpuNotFree, match="lists no GPU GPU-gone"):
        take_gpu(GPUS, [], "resumed", recorded="GPU-gone")


def test_a_new_run_handed_a_gpu_a_resumed_run_holds_takes_a_free_one_of_the_node():
    resumed = ServingClaim(GPUS[1].uuid, "resumed run on Ray's id 3")
    assert resumed.try_take()
    taken = []
    try:
        taken.append(take_gpu(GPUS, ["1"], "new run"))
        taken.append(take_gpu(GPUS, ["3"], "new run"))
        assert [(g, c is not None) for g, c in taken] == [(GPUS[0], True), (GPUS[3], True)]
    finally:
        resumed.release()
        for _, claim in taken:
            claim.release()
