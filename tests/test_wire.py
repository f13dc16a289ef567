"""Framing over a pipe and through shared regions: round trips, fallbacks, malformed messages."""

import io
import os
import threading
import time

import numpy as np
import pytest

from sandbox import wire


@pytest.fixture
def region():
    r = wire.Region.create("test", 1 << 20)
    yield r
    r.close()


def _through(region, header, blobs, reader_region=None, max_bytes=1 << 30):
    """Send into a byte stream (and the region), read it back as the parent does."""
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: wire.send(os.fdopen(w, "wb"), header, blobs, region))
    writer.start()
    reader = wire.DeadlineReader(r)
    try:
        return reader.receive(time.monotonic() + 5, max_bytes, reader_region)
    finally:
        writer.join()
        reader.close()
        os.close(r)


def test_blobs_that_fit_go_through_the_region_and_come_back_as_copies(region):
    blobs = [b"a" * 5000, b"", os.urandom(70_000)]
    header, got = _through(region, {"op": "x"}, blobs, region)
    assert header == {"op": "x", "blobs": 0}
    assert got == blobs and all(isinstance(b, bytes) for b in got)


def test_blobs_too_large_for_the_region_go_by_pipe(region):
    blobs = [os.urandom(600_000), os.urandom(600_000)]  # 1.2 MB against a 1 MiB region
    assert region.place(blobs) is None
    header, got = _through(region, {"op": "x"}, blobs, region)
    assert header["blobs"] == 2 and got == blobs


def test_a_trusted_reader_gets_large_blobs_as_views_into_the_region():
    region = wire.Region.create("test", 4 << 20)
    big = os.urandom((1 << 20) + 4096)  # above the 1 MiB under which blobs are copied anyway
    try:
        lengths = region.place([b"head", big])
        got = region.take(lengths, 1 << 30, copy=False)
        assert got[0] == b"head" and isinstance(got[0], bytes)  # small blobs are copied anyway
        assert isinstance(got[1], memoryview) and got[1].obj is region._map  # no copy: the region's own bytes
        assert bytes(got[1]) == big
        got[1].release()
        copied = region.take(lengths, 1 << 30, copy=True)
        assert isinstance(copied[1], bytes) and copied[1] == big  # an untrusted reader's copy
    finally:
        region.close()


def test_offsets_are_aligned_so_typed_views_stay_aligned(region):
    lengths = region.place([b"x" * 3, b"y" * 8192, b"z"])
    assert lengths == [3, 8192, 1]
    assert wire._extent(lengths) == 4096 + 8192 + 1
    assert region.take(lengths, 1 << 30, copy=True) == [b"x" * 3, b"y" * 8192, b"z"]


@pytest.mark.parametrize("lengths, match", [
    ("12", "list of blob lengths"), ([-1], "list of blob lengths"), ([True], "list of blob lengths"),
    ([1 << 21], "do not fit"), ([600_000, 600_000], "do not fit"), ([10] * 5000, "list of blob lengths"),
])
def test_malformed_region_lengths_are_refused(region, lengths, match):
    with pytest.raises(wire.WireError, match=match):
        region.take(lengths, 1 << 40, copy=True)


def test_region_blobs_count_against_the_answer_limit(region):
    lengths = region.place([os.urandom(5000)])
    with pytest.raises(wire.WireError, match="exceeds the limit"):
        region.take(lengths, 4999, copy=True)


def test_a_message_in_a_region_the_reader_does_not_have_is_refused(region):
    with pytest.raises(wire.WireError, match="not given"):
        _through(region, {"op": "x"}, [b"abc"], None)


def test_a_header_json_cannot_carry_is_refused_by_name_and_nothing_is_written():
    stream = io.BytesIO()
    answer = {"status": "ok", "samples_ms": [0.5, 0.6], "launch_records": np.zeros((2, 4), np.uint64),
              "phases": {"read_back": 0.1, "when": object()}}
    with pytest.raises(wire.Unsendable) as refused:
        wire.send(stream, answer, [b"x" * 8])
    assert str(refused.value) == ("a message holds what JSON cannot carry: launch_records: ndarray; "
                                  "phases.when: object")
    assert stream.getvalue() == b""


def test_what_json_carries_is_found_sendable_to_its_depth():
    assert wire.unsendable({"a": [1, 2.5, None, True, {"b": "text"}], 3: "an int key"}) == []
    assert wire.unsendable({"a": [1, {"b": (np.float32(1),)}]}) == ["a[1].b[0]: float32"]
    assert wire.unsendable({("x", 1): 0}) == ["('x', 1) (its key): tuple"]
