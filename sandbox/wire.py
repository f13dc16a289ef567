"""Framing for the pipe between the parent and a GPU worker.

A message is one JSON header frame followed by `header["blobs"]` binary frames. Each frame is an
8-byte big-endian length and its bytes. JSON plus raw bytes, never pickle: the parent must not
execute anything a compromised worker sends, and it re-reads every array with the dtype and shape
it expects itself.

Large blobs can travel through a `Region` instead: a memory-mapped memfd per direction, shared by
the two processes, written by one side only. The header frame still goes through the pipe and
says where the blobs lie (`header["shm"]`: their lengths, laid end to end at 4 KiB-aligned
offsets); a pipe moves a few hundred MB/s, a mapped region several GB/s. The reader of an
untrusted peer copies the bytes out before it looks at them.
"""

from __future__ import annotations

import json
import mmap
import os
import selectors
import struct
import time
from typing import Any, BinaryIO

_LENGTH = struct.Struct(">Q")
ALIGN = 4096
MAX_BLOBS = 4096


class WireError(RuntimeError):
    """The peer sent something that is not a well-formed message."""


class WireTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class PeerClosed(EOFError):
    """The other end of the pipe closed (the process exited)."""


class Unsendable(TypeError):
    """A header holds a value JSON cannot carry; the message names where. Nothing was written."""


def unsendable(value: Any, path: str = "") -> list[str]:
    """Where `value` holds what JSON cannot carry, as `key.key[index]: type` (empty when all of it can)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return []
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found += unsendable(item, where) if isinstance(key, (str, int, float, bool)) else [
                f"{where} (its key): {type(key).__name__}"]
        return found
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in unsendable(v, f"{path}[{i}]")]
    return [f"{path or 'the header'}: {type(value).__name__}"]


def encode(header: dict[str, Any], blobs: list[bytes | memoryview] = ()) -> list[bytes | memoryview]:
    """The frames of one message, ready to be written in order."""
    header = dict(header, blobs=len(blobs))
    try:
        head = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
    except TypeError:
        raise Unsendable("a message holds what JSON cannot carry: " + "; ".join(unsendable(header)[:5])) from None
    frames: list[bytes | memoryview] = [_LENGTH.pack(len(head)), head]
    for blob in blobs:
        view = memoryview(blob).cast("B")
        frames += [_LENGTH.pack(view.nbytes), view]
    return frames


class Region:
    """A shared memory region (a memfd mapped by both processes) for one direction's blobs.

    One message at a time: the writer places a message's blobs, the reader takes them before the
    writer places the next one (the protocol is strictly job, then answer)."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self._map = mmap.mmap(fd, size)
        self._view = memoryview(self._map)

    @classmethod
    def create(cls, name: str, size: int) -> "Region":
        """A new region; its fd is inheritable by a child started with pass_fds."""
        fd = os.memfd_create(name, 0)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def place(self, blobs: list[bytes | memoryview]) -> list[int] | None:
        """Copy the blobs in, end to end; their lengths, or None when they do not fit."""
        views = [memoryview(blob).cast("B") for blob in blobs]
        if len(views) > MAX_BLOBS or _extent([v.nbytes for v in views]) > self.size:
            return None
        offset = 0
        for view in views:
            self._view[offset:offset + view.nbytes] = view
            offset = _aligned(offset + view.nbytes)
        return [v.nbytes for v in views]

    def take(self, lengths: Any, max_bytes: int, copy: bool) -> list[bytes | memoryview]:
        """The blobs a header's `shm` lengths describe. `copy=False` gives views into the region, valid
        until the peer's next message: only for a trusted peer that waits for the answer."""
        if (not isinstance(lengths, list) or len(lengths) > MAX_BLOBS
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths)):
            raise WireError("'shm' must be a list of blob lengths")
        if sum(lengths) > max_bytes:
            raise WireError(f"blobs of {sum(lengths)} bytes in all: that exceeds the limit of {max_bytes}")
        if _extent(lengths) > self.size:
            raise WireError(f"blobs of {sum(lengths)} bytes do not fit the {self.size}-byte region")
        blobs, offset = [], 0
        for n in lengths:
            view = self._view[offset:offset + n]
            blobs.append(bytes(view) if copy or n < (1 << 20) else view)
            offset = _aligned(offset + n)
        return blobs

    def close(self) -> None:
        try:
            self._view.release()
            self._map.close()
        except BufferError:  # a view handed out is still alive: the mapping goes with it
            pass
        os.close(self.fd)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _extent(lengths: list[int]) -> int:
    """Bytes a region needs for these blobs, laid out by Region.place."""
    return sum(_aligned(n) for n in lengths[:-1]) + (lengths[-1] if lengths else 0)


def send(stream: BinaryIO, header: dict[str, Any], blobs: list[bytes | memoryview] = (),
         region: Region | None = None) -> None:
    """Frames on the pipe; with a region, the blobs go there when they fit (the header says so)."""
    if region is not None and blobs:
        lengths = region.place(blobs)
        if lengths is not None:
            header, blobs = dict(header, shm=lengths), ()
    for frame in encode(header, blobs):
        stream.write(frame)
    stream.flush()


def receive(stream: BinaryIO, max_bytes: int, region: Region | None = None) -> tuple[dict[str, Any], list]:
    """Blocking read of one message (used by the worker, whose parent is trusted): blobs in the
    region come as views into it, valid until the parent's next message."""
    header = _decode_header(_read_frame(lambda n: _read_exact(stream, n), max_bytes))
    blobs = [_read_frame(lambda n: _read_exact(stream, n), max_bytes) for _ in range(header["blobs"])]
    if "shm" in header:
        if region is None:
            raise WireError("a message in shared memory, and no region to read it from")
        blobs += region.take(header.pop("shm"), max_bytes, copy=False)
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

    def receive(self, deadline: float, max_bytes: int, region: Region | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """One message, or WireTimeout when `deadline` (time.monotonic()) passes first. Blobs the
        peer placed in `region` are copied out before anything reads them."""
        read = lambda n: self._read_exact(n, deadline)  # noqa: E731
        header = _decode_header(_read_frame(read, max_bytes))
        count = header["blobs"]
        total = 0
        blobs = []
        for _ in range(count):
            blob = _read_frame(read, max_bytes - total)
            total += len(blob)
            blobs.append(blob)
        if "shm" in header:
            if region is None:
                raise WireError("the peer answered in shared memory it was not given")
            blobs += region.take(header.pop("shm"), max_bytes - total, copy=True)
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
    if header["blobs"] > MAX_BLOBS:
        raise WireError(f"too many blobs: {header['blobs']}")
    return header
