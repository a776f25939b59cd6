"""Requests to the core process through shared memory: a ring the consuming side writes, the worker reads.

Layout: :class:`RequestRing` (the consuming side: places a pickled request in a file-backed shared mapping
and hands the pipe a 17-byte descriptor instead; releases the space in request order, as the answers come)
and :class:`RingView` (the worker: maps the same file, unlinks it, reads a request from its descriptor).
``rankwatch replay``'s log reader uses a ring the other way round: its forked child places the batches, the
parent reads them through the mapping it inherited (:meth:`RequestRing.read`).
:func:`descriptor_of` tells a descriptor from a pickled request (pickles never start with a NUL byte);
:func:`widen_pipe` raises a pipe's capacity where Linux allows (the core's pipes, replay's log reader).

Why: a poll's batch of one pair is about 2 MB, the requests' pipe holds 1 MiB (the Linux maximum without
privileges), so each batch written to the pipe waited until the worker had finished the batch before it and
read this one: about an eighth of the consuming thread's time went to those waits (docs/benchmarks.md). A
descriptor never fills the pipe; the ring holds the batches in flight (``max_in_flight`` of them, bounded) and
a request that does not fit goes through the pipe as before, so the ring changes timing only, never order or
content. The space of a request is reused only after its answer was read, and the worker answers a request
after it has unpickled it, so nothing is overwritten while it is read. Where ``/dev/shm`` is absent (not
Linux), there is no ring and every request goes through the pipe.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

_DESCRIPTOR = struct.Struct("<QQ")  # offset, length (after the NUL byte that marks a descriptor)
RING_BYTES = 32 << 20
SHM_DIR = Path("/dev/shm")


class RequestRing:
    """The consuming side's ring: one contiguous region per request in the ring, released oldest first."""

    def __init__(self, size: int = RING_BYTES, directory: Path = SHM_DIR) -> None:
        fd, name = tempfile.mkstemp(prefix="rankwatch-core-", dir=directory)
        self.path = name
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                # The pages reserved now: a /dev/shm too small for the ring (a container's 64 MB, shared with
                # others) refuses here, and the requests take the pipe, instead of SIGBUS on a write later.
                os.posix_fallocate(fd, 0, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self.size = size
        self._head = 0  # where the next region starts
        self._held: deque[int | None] = deque()  # per unanswered request: where its region starts, or None
        self._live = 0  # regions among _held
        self.placed = 0  # requests that went through the ring (the rest through the pipe)

    @classmethod
    def open(cls, size: int = RING_BYTES, directory: Path = SHM_DIR) -> RequestRing | None:
        """A ring, or None where shared memory is unavailable (the requests then all take the pipe)."""
        if not directory.is_dir():
            return None
        try:
            return cls(size, directory)
        except OSError:
            return None

    def place(self, data: bytes) -> bytes:
        """What to write on the pipe for ``data``: a descriptor of its copy in the ring, or ``data`` itself
        when it does not fit (call once per request, in the order the requests are written)."""
        start = self._fit(len(data))
        if start is None:
            self._held.append(None)
            return data
        self._head = start + len(data)
        self._map[start:self._head] = data
        self._held.append(start)
        self._live += 1
        self.placed += 1
        return b"\x00" + _DESCRIPTOR.pack(start, len(data))

    def answered(self) -> None:
        """The oldest request was answered: its region (if any) is free again."""
        if self._held.popleft() is not None:
            self._live -= 1
            if not self._live:
                self._head = 0  # empty: start over at the beginning, where the most room is

    def _fit(self, n: int) -> int | None:
        if n == 0 or n > self.size // 2:
            return None
        if not self._live:
            return 0
        tail = next(r for r in self._held if r is not None)  # the oldest region not yet answered
        head = self._head
        if head > tail:  # free: [head, size) and [0, tail)
            if n <= self.size - head:
                return head
            return 0 if n < tail else None  # wrap around (head never catches up with tail: strict <)
        return head if head + n < tail else None  # wrapped: free is [head, tail)

    def read(self, descriptor: bytes) -> memoryview:
        """What a descriptor of :meth:`place` points to, where the ring's writer is a forked child of this
        process and this one reads (``rankwatch replay``'s log reader): a view, released by the caller."""
        return _region(self._map, descriptor)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.unlink()
        self._map.close()


class RingView:
    """The worker's view of the ring: mapped once, then the file is removed (the mapping stays)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        try:
            os.unlink(path)  # nothing is left in /dev/shm once both sides have it mapped
        except FileNotFoundError:
            pass

    def read(self, descriptor: bytes) -> memoryview:
        """The request a descriptor points to (a view: unpickle it before answering the request)."""
        return _region(self._map, descriptor)


def _region(mapping: mmap.mmap, descriptor: bytes) -> memoryview:
    start, length = _DESCRIPTOR.unpack_from(descriptor, 1)
    return memoryview(mapping)[start:start + length]


def widen_pipe(conn: Any, size: int = 1 << 20) -> None:
    """Raise a pipe's capacity to ``size`` (Linux ``F_SETPIPE_SZ``; capped by fs.pipe-max-size, 1 MiB by
    default); elsewhere, or when refused, the pipe keeps its default (writes then wait for the reader)."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (ImportError, OSError, ValueError):
        pass


def descriptor_of(data: bytes) -> bool:
    """Whether ``data`` read from the pipe is a ring descriptor rather than a pickled request."""
    return data[:1] == b"\x00"
