"""What ModuleState restores before every launch, from a real NVRTC CUBIN, with the device stood in for by a
fake module (addresses by name) and fake copies: every `__device__` variable on its own, every constant bank
whole where its variables agree on a base, variable by variable where they do not. The GPU side:
tests/gpu/test_module_state.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.worker_side import gpu, module_state
from harness.worker_side.device_heap import heap_calls
from harness.worker_side.device_state import constant_sections
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.module_state import ModuleState, UnrestorableState
from tests.test_device_state import CONSTANTS, cubin

# CONSTANTS' bank (.nv.constant3, 32 bytes): tag at 0, counter at 4, table at 8, where at 24; `target` is __device__.
TESTS = Path(__file__).resolve().parent
BANK_BASE = 0x7000_0000
CONSTANT_OFFSETS = {"tag": (0, 1), "counter": (4, 4), "table": (8, 12), "where": (24, 8)}


class _Module:
    """Addresses by name, as cuModuleGetGlobal gives them."""

    def __init__(self, found: dict[str, tuple[int, int]]):
        self.found = found

    def global_address(self, name: str):
        return self.found.get(name)


class _Allocation:
    count = 0

    def __init__(self, nbytes: int):
        _Allocation.count += 1
        self.nbytes, self.ptr = nbytes, 0x1000_0000 * _Allocation.count

    def free(self) -> None:
        self.ptr = 0


@pytest.fixture
def copies(monkeypatch):
    """Every copy queued, as (destination, source, bytes)."""
    made: list[tuple[int, int, int]] = []
    monkeypatch.setattr(gpu, "Allocation", _Allocation)
    monkeypatch.setattr(gpu, "copy", lambda destination, source, nbytes, stream: made.append((destination, source,
                                                                                              nbytes)))
    return made


def _bank_at(base: int, moved: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
    found = {name: (base + offset, size) for name, (offset, size) in CONSTANT_OFFSETS.items()}
    for name, address in (moved or {}).items():
        found[name] = (address, found[name][1])
    return {**found, "target": (0x9000_0000, 4)}


def test_a_constant_bank_is_restored_whole_and_each_device_variable_on_its_own(copies):
    state = ModuleState(_Module(_bank_at(BANK_BASE)), cubin(CONSTANTS), stream=None)
    assert state.whole_banks == 1 and state.nbytes == 4 + 32
    snapshot = list(copies)  # right after loading: device -> image
    assert {(source, nbytes) for _, source, nbytes in snapshot} == {(0x9000_0000, 4), (BANK_BASE, 32)}
    copies.clear()
    state.restore(stream=None)  # before a launch: image -> device, the bank's padding included
    assert {(destination, nbytes) for destination, _, nbytes in copies} == {(0x9000_0000, 4), (BANK_BASE, 32)}
    assert {source for _, source, _ in copies} == {destination for destination, _, _ in snapshot}
    state.free()


def test_a_bank_whose_variables_disagree_on_its_base_is_restored_variable_by_variable(copies):
    state = ModuleState(_Module(_bank_at(BANK_BASE, moved={"table": 0x7100_0000})), cubin(CONSTANTS), stream=None)
    assert state.whole_banks == 0 and state.nbytes == 4 + 1 + 4 + 12 + 8
    copies.clear()
    state.restore(stream=None)
    assert {(destination, nbytes) for destination, _, nbytes in copies} == {
        (0x9000_0000, 4), (BANK_BASE, 1), (BANK_BASE + 4, 4), (0x7100_0000, 12), (BANK_BASE + 24, 8)}


@pytest.mark.parametrize("found", [
    {**_bank_at(BANK_BASE), "counter": None},
    {**_bank_at(BANK_BASE), "table": (BANK_BASE + 8, 16)},  # the driver's size is not the symbol's
], ids=["not_found", "other_size"])
def test_a_constant_the_worker_cannot_locate_is_refused(copies, found):
    with pytest.raises(UnrestorableState, match="cannot be located"):
        ModuleState(_Module({k: v for k, v in found.items() if v is not None}), cubin(CONSTANTS), stream=None)
    assert copies == []


def test_banks_count_against_the_limits(copies, monkeypatch):
    monkeypatch.setattr(module_state, "MAX_VARIABLES", 1)  # the bank and `target` make two
    with pytest.raises(UnrestorableState, match="constant banks"):
        ModuleState(_Module(_bank_at(BANK_BASE)), cubin(CONSTANTS), stream=None)


# ---------------------------------------------------------------- the GPU tests' kernels hold what they assume

def _compiled(path: Path) -> bytes:
    result = compile_kernel(path.read_text(), "matmul_f32", arch="sm_90")
    assert result.ok, result.log
    return result.cubin


def test_the_constant_writes_kernel_has_the_layout_it_writes_into():
    # tests/gpu/kernels/constant_writes.cu writes the padding byte after `tag` and a relocated pointer.
    bank, = constant_sections(_compiled(TESTS / "gpu" / "kernels" / "constant_writes.cu"))
    assert [(v.name, v.offset, v.size, v.relocated) for v in bank.variables] == [
        ("tag", 0, 1, ()), ("counter", 4, 4, ()), ("where", 8, 8, (0,))]
    assert bank.initial[:8] == b"\x01\0\0\0\x07\0\0\0"


def test_the_constant_bank_counter_keeps_its_count_in_a_restored_bank():
    binary = _compiled(TESTS / "exploits" / "constant_bank_counter.cu")
    assert [v.name for bank in constant_sections(binary) for v in bank.variables] == ["launches"]
    assert heap_calls(binary) == ()
    assert heap_calls(_compiled(TESTS / "exploits" / "heap_counter.cu")) == ("free", "malloc")
