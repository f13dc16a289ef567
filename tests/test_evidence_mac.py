"""The keyed MAC over the timed launches' evidence (harness/worker_side/evidence_mac.py), without a GPU: the numpy
form against a plain-Python one, a changed bit or swapped words always seen, the CUDA kernel compiled by NVRTC, the
worker's check naming the launch whose record was repaired, and the parent turning that into evidence_tampered."""

import numpy as np
import pytest

from harness import jobs
from harness.judging import tampered_reasons
from harness.results import ReasonCode
from harness.worker_side import evidence_mac
from harness.worker_side.evidence_mac import MASK, Seal, mac, splitmix64


def plain_mac(data: bytes, key: int, k2: int) -> int:
    """H written out word by word in Python integers."""
    padded = data + bytes(-len(data) % 4)
    total = 0
    for i in range(len(padded) // 4):
        w = int.from_bytes(padded[4 * i:4 * i + 4], "little")
        m = splitmix64((key + i) & MASK) | 1
        total = (total + ((w ^ k2) * m)) & MASK
    return (total + splitmix64((k2 + len(data)) & MASK)) & MASK


def test_splitmix64_is_the_published_generator():
    # The first outputs of splitmix64 seeded with 0 (state += golden ratio, then mixed), as its reference code gives.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    assert int(splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4, 5, 7, 16, 31, 1021, 4096])
def test_the_numpy_mac_is_the_plain_one(length):
    rng = np.random.default_rng(length)
    data = rng.integers(0, 256, length, dtype=np.uint8)
    key, k2 = (int(v) for v in rng.integers(0, 1 << 63, 2, dtype=np.uint64) * np.uint64(2) + np.uint64(1))
    assert mac(data, key, k2) == plain_mac(data.tobytes(), key, k2)
    assert mac(data, MASK, MASK) == plain_mac(data.tobytes(), MASK, MASK)  # the key's wrap, the pad's zeros


def test_the_mac_depends_on_the_key_and_the_length():
    data = np.arange(40, dtype=np.uint8)
    assert mac(data, 1, 2) != mac(data, 3, 2) and mac(data, 1, 2) != mac(data, 1, 4)
    assert mac(data[:37], 1, 2) != mac(np.concatenate([data[:37], np.zeros(3, np.uint8)]), 1, 2)  # same padded words


def test_flipping_any_bit_or_swapping_two_words_changes_the_mac():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 66, dtype=np.uint8)
    key, k2 = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    honest = mac(data, key, k2)
    for bit in range(data.size * 8):
        flipped = data.copy()
        flipped[bit // 8] ^= np.uint8(1 << (bit % 8))
        assert mac(flipped, key, k2) != honest, bit
    words = data[:64].view(np.uint32)
    for i, j in [(0, 1), (3, 15), (7, 8)]:
        swapped = data.copy()
        swapped[:64].view(np.uint32)[[i, j]] = words[[j, i]]
        assert mac(swapped, key, k2) != honest, (i, j)


def test_the_mac_kernel_compiles_with_the_referee_s_kernels():
    from harness.worker_side.nvrtc import compile_kernel
    from harness.worker_side.utility_kernels import UTILITY_SOURCE

    compiled = compile_kernel(UTILITY_SOURCE, "referee_mac", arch="sm_90")
    assert compiled.ok, compiled.log
    assert b"referee_mac" in compiled.cubin


class _Evidence:
    """The evidence context as the check sees it: bytes at addresses; its kernel fails where `kernel` is False."""

    def __init__(self, memory: dict[int, np.ndarray], kernel: bool):
        self.memory, self.kernel, self.asked = memory, kernel, []

    def download(self, ptr: int, nbytes: int) -> np.ndarray:
        return self.memory[ptr][:nbytes].copy()

    def macs(self, groups):
        self.asked.append(groups)
        if not self.kernel:
            raise RuntimeError("no MAC kernel for the evidence context")
        return [sum(mac(self.memory[ptr][:n], key, k2) for ptr, n, key, k2 in group) & MASK for group in groups]


def _sealed(seal: Seal, counts: np.ndarray, outputs: dict[int, list[np.ndarray]]) -> np.ndarray:
    """Records as the MAC kernel leaves them in the scratch: counts, their MAC, the audited outputs' MAC."""
    records = np.zeros((len(counts), 4), dtype=np.uint64)
    records[:, :2] = counts
    for i in range(len(counts)):
        records[i, 2] = mac(records[i, :2], *seal.keys(i, 0))
        records[i, 3] = sum(mac(o, *seal.keys(i, 1 + j)) for j, o in enumerate(outputs.get(i, []))) & MASK
    return records


@pytest.mark.parametrize("kernel", [True, False], ids=["evidence-kernel", "downloaded"])
def test_the_check_names_each_launch_whose_evidence_was_repaired(kernel):
    rng = np.random.default_rng(3)
    outputs = {1: [rng.integers(0, 256, 4099, dtype=np.uint8), rng.integers(0, 256, 64, dtype=np.uint8)],
               3: [rng.integers(0, 256, 4099, dtype=np.uint8), rng.integers(0, 256, 64, dtype=np.uint8)]}
    memory = {1000 * (i + 1) + j: o.copy() for i, os_ in outputs.items() for j, o in enumerate(os_)}
    snapshots = {i: [(1000 * (i + 1) + j, o.size) for j, o in enumerate(os_)] for i, os_ in outputs.items()}
    evidence = _Evidence(memory, kernel)
    seal = Seal(None, evidence)
    counts = np.array([[0, 0], [5, 0], [0, 2], [0, 0]], dtype=np.uint64)
    records = _sealed(seal, counts, outputs)
    assert seal.verify(records, snapshots) == []
    assert len(evidence.asked[0]) == 2 and evidence.asked[0][1][1][1] == 64  # both audits, every output, one call

    records[1, 0] = 0  # a later launch zeroes launch 1's unwritten count
    memory[4001][10] ^= 1  # and repairs a byte of launch 3's second output
    assert seal.verify(records, snapshots) == ["launch 1: its counts", "launch 3: its audited outputs"]


def test_each_launch_and_part_has_keys_of_its_own_from_a_secret_of_each_job():
    first, second = Seal(None, None), Seal(None, None)
    keys = {first.keys(launch, part) for launch in range(50) for part in range(3)}
    assert len(keys) == 150
    assert first.keys(0, 0) != second.keys(0, 0) and first.keys(4, 1) == first.keys(4, 1)


def test_a_record_copied_from_another_launch_does_not_pass():
    """A launch that copies an honest launch's record and snapshot over a skipped one's is caught: keys differ."""
    data = np.arange(256, dtype=np.uint8)
    evidence = _Evidence({8: data}, True)
    seal = Seal(None, evidence)
    records = _sealed(seal, np.zeros((2, 2), dtype=np.uint64), {0: [data], 1: [data]})
    records[1] = records[0]
    assert seal.verify(records, {0: [(8, 256)], 1: [(8, 256)]}) == ["launch 1: its counts",
                                                                     "launch 1: its audited outputs"]


def test_the_parent_turns_a_tampered_fact_into_its_reason():
    (reason,) = tampered_reasons({"tampered": ["launch 7: its audited outputs", "launch 9: its counts"]}, "big")
    assert reason.code is ReasonCode.EVIDENCE_TAMPERED and reason.case == "big"
    assert "of 2 timed launches" in reason.detail and "first: launch 7: its audited outputs" in reason.detail
    assert tampered_reasons({"tampered": []}, "big") == [] and tampered_reasons({}, "big") == []
    with pytest.raises(jobs.AnswerError):
        tampered_reasons({"tampered": "launch 1"}, "big")


def test_a_launch_s_seal_is_queued_over_its_counts_then_each_audited_output():
    class Utilities:
        def __init__(self):
            self.calls = []

        def mac(self, ptr, nbytes, key, k2, out):
            self.calls.append((ptr, nbytes, (key, k2), out))

    utilities = Utilities()
    seal = Seal(utilities, None)
    seal.queue(4, 800, None)
    seal.queue(5, 800, [(9000, 4099), (20000, 64)])
    assert utilities.calls == [(800, evidence_mac.COUNTS_BYTES, seal.keys(4, 0), 816),
                               (800, 16, seal.keys(5, 0), 816), (9000, 4099, seal.keys(5, 1), 824),
                               (20000, 64, seal.keys(5, 2), 824)]
    assert evidence_mac.RECORD_BYTES == 32


def test_every_timed_launch_is_sealed_after_its_counts_and_snapshot_before_the_next(monkeypatch):
    """The timed loop's queue, with stand-ins that log each step: a launch's seal (and the record's move) comes after
    its counts and its snapshot, before the next launch; only audited launches seal outputs."""
    from harness.worker_side import timed_loop

    log = []

    class Job:
        def outputs(self, s):
            return [(None, {"nbytes": 64, "itemsize": 4}, type("B", (), {"ptr": 5000 + s})())]

        def launch(self, s):
            log.append(("launch", s))

        def poison(self, s, byte):
            pass

    class Utilities:
        def hold(self, n):
            pass

        def count_equal(self, ptr, elements, itemsize, byte, counter):
            log.append(("count", counter))

        def mac(self, ptr, nbytes, key, k2, out):
            log.append(("mac", ptr, nbytes, out))

        def queued(self, *args):
            pass

    class Evidence:
        def take(self, destination, source, nbytes, stream):
            log.append(("take", destination, source, nbytes))

    monkeypatch.setattr(timed_loop.gpu, "record", lambda event, stream: None)
    monkeypatch.setattr(timed_loop.gpu, "fill", lambda ptr, byte, nbytes, stream: log.append(("zero", ptr, nbytes)))
    monkeypatch.setattr(timed_loop.gpu, "completed", lambda event: False)
    loop = object.__new__(timed_loop.TimedLoop)
    loop.utilities, loop.job, loop.evidence = Utilities(), Job(), Evidence()
    loop.context = type("C", (), {"stream": 0})()
    loop.header = {"cold_l2": False, "poison": 0xFF}
    loop.iterations, loop.sets, loop.warmups, loop.checked, loop.clocked, loop.fresh_key = 2, 2, 0, [1], False, None
    loop.seal = Seal(loop.utilities, loop.evidence)
    loop.pairs = [type("P", (), {"start": None, "end": None})() for _ in range(2)]
    loop.queued = loop.pairs[0]
    loop.scratch, loop.counters, loop.snapshots = (type("A", (), {"ptr": p})() for p in (100, 200, 300))
    loop.queue_timed_launches()
    assert log == [("launch", 0), ("zero", 100, 32), ("count", 100), ("mac", 100, 16, 116), ("take", 200, 100, 32),
                   ("launch", 1), ("zero", 100, 32), ("count", 100), ("take", 300, 5001, 64), ("mac", 100, 16, 116),
                   ("mac", 5001, 64, 124), ("take", 232, 100, 32)]
