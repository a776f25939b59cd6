"""The requests' ring: what the worker reads is what was placed, no live region is ever overwritten, and a
request that does not fit goes through the pipe (the ring's model here is a list of live byte ranges)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from rankwatch.consumers.handoff import RequestRing, RingView, descriptor_of


def test_random_traffic_reads_back_and_never_overlaps(tmp_path: Path) -> None:
    rng = random.Random(5)
    ring = RequestRing(size=4096, directory=tmp_path)
    view = RingView(ring.path)
    assert not os.path.exists(ring.path)  # the worker's side removed the file; both mappings stay
    pending: list[tuple[bytes, bytes]] = []  # (what was written on the pipe, the request), oldest first
    through_pipe = 0
    for step in range(5000):
        if pending and (rng.random() < 0.45 or len(pending) > 12):
            wire, data = pending.pop(0)
            # The worker reads a request before it is answered, so check it at its answer.
            assert (bytes(view.read(wire)) if descriptor_of(wire) else wire) == data, step
            ring.answered()
            continue
        data = b"\x80" + rng.randbytes(rng.choice([0, 1, 10, 300, 900, 2047, 2048, 2049, 3000]))
        wire = ring.place(data)
        if descriptor_of(wire):
            assert len(wire) == 17
        else:
            assert wire is data
            through_pipe += 1
        pending.append((wire, data))
        # Every request still unanswered reads back intact (nothing placed later overwrote it).
        for w, d in pending:
            if descriptor_of(w):
                assert bytes(view.read(w)) == d, step
    assert ring.placed > 1000 and through_pipe > 100
    ring.close()


def test_too_large_or_full_takes_the_pipe(tmp_path: Path) -> None:
    ring = RequestRing(size=1000, directory=tmp_path)
    big = b"\x80" + b"x" * 600
    assert ring.place(big) is big  # over half the ring: never placed
    a = ring.place(b"\x80" + b"a" * 400)
    b = ring.place(b"\x80" + b"b" * 400)
    assert descriptor_of(a) and descriptor_of(b)
    c = b"\x80" + b"c" * 300
    assert ring.place(c) is c  # full (401 + 401 used, 198 left)
    ring.answered()  # the big request (every request is answered in order, whichever way it went)
    assert not descriptor_of(ring.place(b"\x80" + b"d" * 300))  # a is not answered yet: still full
    ring.answered()  # a is free: the next one wraps to the start
    d = ring.place(b"\x80" + b"d" * 300)
    assert descriptor_of(d)
    ring.close()


def test_without_shared_memory_there_is_no_ring(tmp_path: Path) -> None:
    assert RequestRing.open(directory=tmp_path / "absent") is None


def test_a_ring_that_cannot_be_sized_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", refuse)
    assert RequestRing.open(directory=tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_a_ring_whose_pages_cannot_be_reserved_is_not_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared-memory file system too small for the ring refuses it when it is made (the requests, or the replay's
    batches, then take the pipe), not with SIGBUS at a write into a page it cannot back."""
    calls = []

    def full(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert RequestRing.open(size=1 << 20, directory=tmp_path) is None
    assert calls == [1 << 20]
    assert list(tmp_path.iterdir()) == []
