"""The parent's strict reading of worker answers: guard bands, input hashes, array shapes."""

import hashlib
import os

import numpy as np
import pytest

from harness import jobs
from harness.worker_side import buffers
from harness.task import load_task
from tests.test_cli import MATMUL

DIMS = {"m": 3, "n": 4, "k": 5}


@pytest.fixture(scope="module")
def task():
    return load_task(MATMUL)


@pytest.fixture(scope="module")
def layout(task):
    return jobs.Layout.for_case(task, DIMS)


def _clean_guards(layout, seed, sets=1):
    blobs = []
    for s in range(sets):
        for i in range(len(layout.arrays)):
            head, tail = buffers.canary(seed, s * len(layout.arrays) + i)
            blobs += [head.tobytes(), tail.tobytes()]
    return blobs


def _hashes(inputs):
    return {"input_sha256": [{name: buffers.sha256(a) for name, a in inputs.items()}]}


def test_layout_follows_the_signature_order(layout):
    assert [a.name for a in layout.arrays] == ["a", "b", "c"]
    assert [a.nbytes for a in layout.arrays] == [60, 80, 48]
    assert layout.to_wire()[3] == {"kind": "scalar", "name": "m", "dtype": "int32", "value": 3}


def test_canaries_are_secret_per_seed_and_buffer():
    a = buffers.canary(1, 0)
    assert not np.array_equal(a[0], buffers.canary(2, 0)[0])
    assert not np.array_equal(a[0], buffers.canary(1, 1)[0])
    assert np.array_equal(a[1], buffers.canary(1, 0)[1])
    assert a[0].nbytes == buffers.GUARD_BYTES and buffers.GUARD_BYTES % 256 == 0  # keeps data 256-byte aligned


def test_untouched_memory_is_clean(task, layout):
    inputs = {"a": np.ones((3, 5), np.float32), "b": np.ones((5, 4), np.float32)}
    integrity = jobs.check_integrity(_hashes(inputs), _clean_guards(layout, 7), layout, 7, [inputs])
    assert integrity.guard_violations == [] and integrity.modified_inputs == []


@pytest.mark.parametrize("blob, byte, where, distance", [
    (5, 0, "after the end", 1),                      # c's tail guard, first byte: one past the end
    (5, 8, "after the end", 9),
    (4, buffers.GUARD_BYTES - 1, "before the start", 1),  # c's head guard, last byte: one before
])
def test_a_changed_guard_byte_is_named(layout, blob, byte, where, distance):
    inputs = {"a": np.ones((3, 5), np.float32), "b": np.ones((5, 4), np.float32)}
    guards = [bytearray(g) for g in _clean_guards(layout, 7)]
    guards[blob][byte] ^= 0xFF
    integrity = jobs.check_integrity(_hashes(inputs), [bytes(g) for g in guards], layout, 7, [inputs])
    assert integrity.guard_violations == [f"c: 1 bytes changed {where} (nearest {distance} bytes away)"]


def test_a_changed_input_is_named(layout):
    inputs = {"a": np.ones((3, 5), np.float32), "b": np.ones((5, 4), np.float32)}
    answer = _hashes({"a": inputs["a"], "b": inputs["b"] * 2})
    integrity = jobs.check_integrity(answer, _clean_guards(layout, 7), layout, 7, [inputs])
    assert integrity.modified_inputs == ["b"]


def test_answers_of_the_wrong_shape_are_refused(layout):
    with pytest.raises(jobs.AnswerError, match="expected 48 bytes"):
        jobs.read_arrays([b"\0" * 47], layout.outputs)
    with pytest.raises(jobs.AnswerError, match="expected 1 arrays"):
        jobs.read_arrays([], layout.outputs)
    with pytest.raises(jobs.AnswerError, match="guard band count"):
        jobs.check_integrity({"input_sha256": [{}]}, [], layout, 7, [{}])


def test_outputs_are_read_with_the_parents_dtype(layout):
    values = np.arange(12, dtype=np.float32)
    arrays = jobs.read_arrays([values.tobytes()], layout.outputs)
    assert arrays["c"].dtype == np.float32 and arrays["c"].shape == (3, 4)
    assert arrays["c"][2, 3] == 11


def test_jobs_refuse_inputs_that_do_not_match_the_layout(task, layout):
    geometry = task.launch.resolve(task.cases[0])
    with pytest.raises(ValueError, match="input a: expected float32"):
        jobs.make_run_job(b"cubin", "matmul_f32", layout, geometry,
                     {"a": np.ones((3, 5), np.float64), "b": np.ones((5, 4), np.float32)}, (0xFF,), 1)


# -- outputs in answers ---------------------------------------------------------------------------
def _h(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def test_time_slots_name_the_input_set_of_every_output():
    assert buffers.time_slots([5, 2, 2], sets=4, outputs=2) == ["2/0", "2/1", "1/0", "1/1", "0/0", "0/1", "1/0", "1/1",
                                                             "2/0", "2/1", "3/0", "3/1"]
    assert buffers.run_slots(2, 1) == ["0/0", "0/0"]


def test_each_distinct_output_travels_once_and_known_ones_not_at_all():
    x, y, z = b"x" * 100, b"y" * 100, b"z" * 100
    slots = ["0/0", "1/0", "0/0", "1/0", "0/0"]
    fields, sent = buffers.pack_outputs([x, y, x, z, x], slots, {"1/0": [_h(y)]})
    assert sent == [x, z]
    assert fields == {"output_sha256": [_h(x), _h(y), _h(x), _h(z), _h(x)], "outputs_sent": 2}
    outputs, rest = jobs.unpack_outputs(fields, sent + [b"guard"], slots, {"1/0": {_h(y)}})
    assert outputs == [x, None, x, z, x] and rest == [b"guard"]


def test_a_hash_known_for_another_slot_still_travels():
    x = b"x" * 100  # right for set 0; a kernel that gives it for set 1 too must be compared there
    fields, sent = buffers.pack_outputs([x], ["1/0"], {"0/0": [_h(x)]})
    assert sent == [x]
    outputs, _ = jobs.unpack_outputs(fields, sent, ["1/0"], {"0/0": {_h(x)}})
    assert outputs == [x]


@pytest.mark.parametrize("tamper, match", [
    (lambda f, b: ({**f, "outputs_sent": 3}, b), "do not match the job"),
    (lambda f, b: ({**f, "output_sha256": f["output_sha256"][:1]}, b), "do not match the job"),
    (lambda f, b: (f, [b"other" * 20] + b[1:]), "do not match their hashes"),
    (lambda f, b: ({**f, "output_sha256": [_h(b"y"), f["output_sha256"][1]], "outputs_sent": 1}, b[1:]),
     "neither sent nor verified"),
])
def test_answers_whose_outputs_do_not_add_up_are_refused(tamper, match):
    x, y = b"x" * 100, b"w" * 100
    fields, sent = buffers.pack_outputs([x, y], ["0/0", "1/0"], {})
    fields, blobs = tamper(fields, sent)
    with pytest.raises(jobs.AnswerError, match=match):
        jobs.unpack_outputs(fields, blobs, ["0/0", "1/0"], {})


def test_digests_of_large_blobs_match_hashlib_on_any_number_of_threads():
    blobs = [os.urandom(3 << 20) for _ in range(5)]
    assert buffers.digests(blobs) == [_h(b) for b in blobs]
    assert buffers.digests([np.frombuffer(blobs[0], np.uint8)]) == [_h(blobs[0])]


def test_inputs_the_worker_holds_are_named_and_not_sent():
    import numpy as np

    from harness.jobs import ArraySpec, Layout, make_time_job, resident_key
    from harness.task_model import LaunchGeometry

    layout = Layout((("array", ArraySpec("a", "input", "float32", (4,))), ("array", ArraySpec("b", "input", "float32", (4,))),
                     ("array", ArraySpec("c", "output", "float32", (4,)))))
    sets = [{"a": np.full(4, s, np.float32), "b": np.full(4, -s, np.float32)} for s in range(2)]
    hashes = [{n: buffers.sha256(a) for n, a in inputs.items()} for inputs in sets]
    geometry = LaunchGeometry(grid=(1, 1, 1), block=(4, 1, 1), shared_bytes=0)
    timing = dict(warmups=1, iterations=2, cold_l2=True, checked_launches=[0], guard_seed=5, hashes=hashes)
    header, blobs = make_time_job(b"cubin", "k", layout, geometry, sets, **timing)
    assert len(blobs) == 1 + 4 and all(e["sent"] for row in header["inputs"] for e in row)
    held = frozenset({resident_key("a", hashes[0]["a"]), resident_key("b", hashes[1]["b"]), "a:stale"})
    header, blobs = make_time_job(b"cubin", "k", layout, geometry, sets, **timing, resident=held)
    assert [[e["sent"] for e in row] for row in header["inputs"]] == [[False, True], [True, False]]
    assert [bytes(b) for b in blobs[1:]] == [sets[0]["b"].tobytes(), sets[1]["a"].tobytes()]
    header, blobs = make_time_job(b"cubin", "k", layout, geometry, sets, **{**timing, "hashes": None}, resident=held)
    assert len(blobs) == 5 and all(e == {"key": None, "sent": True} for row in header["inputs"] for e in row)


def test_digests_can_be_started_and_waited_for_later_in_the_blobs_order():
    blobs = [np.frombuffer(os.urandom(5 << 20), np.uint8) for _ in range(3)]
    wait = buffers.digests_later([blobs[2], blobs[0], blobs[2], blobs[1]])  # on the threads: 20 MB
    assert wait() == [_h(blobs[2].tobytes()), _h(blobs[0].tobytes()), _h(blobs[2].tobytes()), _h(blobs[1].tobytes())]
    small = buffers.digests_later([b"ab", b"cd"])
    assert small() == [_h(b"ab"), _h(b"cd")]


@pytest.mark.parametrize("where", [0, buffers.SAME_BYTES_CHUNK - 1, buffers.SAME_BYTES_CHUNK, (9 << 20) - 1])
def test_same_bytes_finds_one_changed_byte_anywhere_in_any_chunk(where):
    a = np.frombuffer(os.urandom(9 << 20), np.uint8)
    b = a.copy()
    assert buffers.same_bytes(a, b)
    b[where] ^= 1
    assert not buffers.same_bytes(a, b)
    assert not buffers.same_bytes(a, a[:-1])


def test_an_input_is_compared_with_the_bytes_it_must_hold_and_takes_their_hash_instead_of_being_hashed():
    from concurrent.futures import Future

    from harness.worker_side.job import _digest

    bytes_ = np.frombuffer(os.urandom(1 << 20), np.uint8)
    # Where the bytes equal those it must hold, their digest is taken as given: the key's of a kept
    # input (a string), or that of the bytes sent with the job, hashed while it ran (a future).
    assert _digest(bytes_, (bytes_.copy(), "0" * 64)) == "0" * 64
    hashing = Future()
    hashing.set_result("1" * 64)
    assert _digest(bytes_, (bytes_.copy(), hashing)) == "1" * 64
    changed = bytes_.copy()
    changed[12345] ^= 0x80
    # A changed input is hashed: the parent sees a digest that is not the one expected.
    assert _digest(changed, (bytes_, "0" * 64)) == _h(changed.tobytes())
    assert _digest(bytes_, None) == _h(bytes_.tobytes())
