"""Framing for the pipe between the parent and a GPU worker.

A message is one JSON header frame followed by `header["blobs"]` binary frames. Each frame is an
8-byte big-endian length and its bytes. JSON plus raw bytes, never pickle: the parent must not
execute anything a compromised worker sends, and it re-reads every array with the dtype and shape
it expects itself.
"""

from __future__ import annotations

import json
import os
import selectors
import struct
import time
from typing import Any, BinaryIO

_LENGTH = struct.Struct(">Q")


class WireError(RuntimeError):
    """The peer sent something that is not a well-formed message."""


class WireTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class PeerClosed(EOFError):
    """The other end of the pipe closed (the process exited)."""


def encode(header: dict[str, Any], blobs: list[bytes | memoryview] = ()) -> list[bytes | memoryview]:
    """The frames of one message, ready to be written in order."""
    header = dict(header, blobs=len(blobs))
    head = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
    frames: list[bytes | memoryview] = [_LENGTH.pack(len(head)), head]
    for blob in blobs:
        view = memoryview(blob).cast("B")
        frames += [_LENGTH.pack(view.nbytes), view]
    return frames


def send(stream: BinaryIO, header: dict[str, Any], blobs: list[bytes | memoryview] = ()) -> None:
    for frame in encode(header, blobs):
        stream.write(frame)
    stream.flush()


def receive(stream: BinaryIO, max_bytes: int) -> tuple[dict[str, Any], list[bytes]]:
    """Blocking read of one message (used by the worker, whose parent is trusted)."""
    header = _decode_header(_read_frame(lambda n: _read_exact(stream, n), max_bytes))
    blobs = [_read_frame(lambda n: _read_exact(stream, n), max_bytes) for _ in range(header["blobs"])]
    return header, blobs


class DeadlineReader:
    """Reads messages from a file descriptor, giving up at a deadline (used by the parent)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._buffer = bytearray()
        self._selector = selectors.DefaultSelector()
        self._selector.register(fd, selectors.EVENT_READ)

    def close(self) -> None:
        self._selector.close()

    def receive(self, deadline: float, max_bytes: int) -> tuple[dict[str, Any], list[bytes]]:
        """One message, or WireTimeout when `deadline` (time.monotonic()) passes first."""
        read = lambda n: self._read_exact(n, deadline)  # noqa: E731
        header = _decode_header(_read_frame(read, max_bytes))
        count = header["blobs"]
        total = 0
        blobs = []
        for _ in range(count):
            blob = _read_frame(read, max_bytes - total)
            total += len(blob)
            blobs.append(blob)
        return header, blobs

    def _read_exact(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                raise WireTimeout("no answer before the deadline")
            chunk = os.read(self._fd, max(1 << 20, size - len(self._buffer)))
            if not chunk:
                raise PeerClosed("the worker closed its pipe")
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    chunks = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            raise PeerClosed("the parent closed its pipe")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_frame(read_exact, max_bytes: int) -> bytes:
    (length,) = _LENGTH.unpack(read_exact(_LENGTH.size))
    if length > max_bytes:
        raise WireError(f"frame of {length} bytes exceeds the limit of {max_bytes}")
    return read_exact(length)


def _decode_header(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("blobs"), int) or header["blobs"] < 0:
        raise WireError("header must be an object with a non-negative 'blobs' count")
    if header["blobs"] > 4096:
        raise WireError(f"too many blobs: {header['blobs']}")
    return header
