"""The GPU worker's bookkeeping for outputs judged on the device, without a GPU: kept expected outputs drop
the least recently used beyond their cap, held outputs are freed at the next job, and a malformed IPC handle
is refused before any CUDA call."""

from __future__ import annotations

import pytest

from harness.worker_side.device_judging import IPC_HANDLE_BYTES, Held, Kept, Opened, pattern


class FakeAllocation:
    def __init__(self, nbytes: int, freed: list):
        self.nbytes, self.freed = nbytes, freed

    def free(self) -> None:
        self.freed.append(self)


def test_kept_outputs_beyond_the_cap_go_least_recently_used_first():
    freed: list = []
    kept = Kept(cap_bytes=250)
    a, b, c = (FakeAllocation(100, freed) for _ in range(3))
    kept.keep("case-a/1", {"c": a})
    kept.keep("case-b/1", {"c": b})
    assert kept.get("case-a/1") == {"c": a}  # now the most recently used
    kept.keep("case-c/1", {"c": c})
    assert kept.keys() == ["case-a/1", "case-c/1"] and freed == [b]
    kept.keep("case-a/1", {"c": FakeAllocation(10, freed)})  # kept again: the old ones go
    assert a in freed
    kept.clear()
    assert kept.keys() == [] and c in freed


def test_one_set_larger_than_the_cap_is_still_kept():
    freed: list = []
    kept = Kept(cap_bytes=10)
    kept.keep("big/1", {"c": FakeAllocation(100, freed)})
    assert kept.keys() == ["big/1"] and freed == []


def test_held_outputs_are_freed_at_release():
    freed: list = []
    held = Held()
    allocations = [FakeAllocation(8, freed) for _ in range(3)]
    for allocation in allocations:
        held.keep(allocation)
    held.release()
    assert sorted(map(id, freed)) == sorted(map(id, allocations))
    held.release()
    assert len(freed) == 3


@pytest.mark.parametrize("entry", [{"handle": "00" * (IPC_HANDLE_BYTES - 1), "offset": 0},
                                   {"handle": "00" * IPC_HANDLE_BYTES, "offset": -1},
                                   {"handle": "00" * IPC_HANDLE_BYTES, "offset": "0"}])
def test_a_malformed_handle_is_refused_before_cuda(entry):
    with pytest.raises(ValueError, match="malformed"):
        Opened(entry)


def test_poison_patterns_fill_the_element():
    assert pattern(0xFF, 4) == 0xFFFFFFFF and pattern(0x7F, 2) == 0x7F7F and pattern(0x7F, 1) == 0x7F
