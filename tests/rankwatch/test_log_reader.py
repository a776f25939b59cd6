"""The log reader's child process hands over exactly the in-process merge's batches, and fails as it would.

The oracle is :class:`pipeline.events.logs.EventLogMerge` run in this process (itself checked against a
per-line heap merge in tests/pipeline/events/test_logs.py) on the same random files: unsorted, with bad
and empty lines, RFC 3339 times, gzip, and chunks of a few bytes.
"""

from __future__ import annotations

import gzip
import multiprocessing
import random
import signal
import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from rankwatch.commands.log_reader import Lines, PrefetchedMerge, Unsent, batches_with_rows, open_merge
from rankwatch.errors import RankwatchError
from rankwatch.pipeline.events.logs import EventLogMerge
from tests.pipeline.events.test_logs import _random_line


def _files(tmp_path: Path, seed: int) -> list[tuple[Path, str]]:
    rng = random.Random(seed)
    files = []
    for i in range(rng.randint(1, 4)):
        stream = "impressions" if i == 0 or rng.random() < 0.5 else "clicks"
        lines = [_random_line(rng, rng.randint(0, 60) + j // 3) for j in range(rng.randint(0, 150))]
        data = b"\n".join(lines) + b"\n"
        path = tmp_path / f"f{i}.jsonl"
        if rng.random() < 0.3:
            path, data = tmp_path / f"f{i}.jsonl.gz", gzip.compress(data)
        path.write_bytes(data)
        files.append((path, stream))
    files.sort(key=lambda f: f[1] != "impressions")
    return files


def _drain(merge: Any) -> list[tuple[list[bool], list[bytes], list[Any]]]:
    out = []
    try:
        for kinds, values, sources in merge.batches():
            out.append((kinds, values, [sources(i) for i in range(len(values))]))
        assert merge.position() == merge.size
    finally:
        merge.close()
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_child_gives_the_in_process_batches(tmp_path: Path, seed: int) -> None:
    files = _files(tmp_path, seed)
    for chunk in (16, 300, 1 << 22):
        expected = _drain(EventLogMerge(files, chunk_bytes=chunk))
        got = _drain(PrefetchedMerge(files, chunk_bytes=chunk))
        assert got == expected, chunk


def test_a_corrupt_gzip_is_the_in_process_error_and_the_child_is_gone(tmp_path: Path) -> None:
    good = gzip.compress(b"\n".join(_random_line(random.Random(1), t) for t in range(5000)) + b"\n")
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(good[: len(good) // 2] + b"\x00garbage" * 50)
    files = [(path, "impressions")]
    with pytest.raises(RankwatchError) as inline:
        _drain(EventLogMerge(files, chunk_bytes=1024))
    merge = PrefetchedMerge(files, chunk_bytes=1024)
    with pytest.raises(RankwatchError) as child:
        _drain(merge)
    assert str(child.value) == str(inline.value) and str(path) in str(child.value)
    assert not merge._child.is_alive()


def _lengths(kinds: list[bool], values: list[bytes], caught_up: Any) -> list[int]:
    return [len(v) for v in values]


@pytest.mark.parametrize("prepare", [None, _lengths])
@pytest.mark.parametrize("handler", ["default", "flag only"])
def test_closing_early_stops_the_child(tmp_path: Path, handler: str, prepare: Any) -> None:
    """Also when this process has a SIGTERM handler that only sets a flag (as `rankwatch run` installs; the
    fork copies it): the child leaves through the broken pipe, without needing the signal; also with its
    writer thread and queue of prepared batches."""
    path = tmp_path / "imp.jsonl"
    path.write_bytes(b"\n".join(_random_line(random.Random(2), t) for t in range(20000)) + b"\n")
    previous = signal.getsignal(signal.SIGTERM)
    if handler == "flag only":
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        merge = PrefetchedMerge([(path, "impressions")], chunk_bytes=4096, prepare=prepare)
        next(batches_with_rows(merge))  # the child is blocked on the pipe, batches ahead
        merge.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not merge._child.is_alive()
    assert merge._child.exitcode == 0  # it ended on its own (the broken pipe), not by a signal


def test_a_missing_file_fails_before_any_child_starts(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        PrefetchedMerge([(tmp_path / "absent.jsonl", "impressions")])


def test_inline_mode_is_the_plain_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(tmp_path, 3)
    monkeypatch.setenv("RANKWATCH_LOG_READER", "inline")
    assert type(open_merge(files)) is EventLogMerge
    monkeypatch.delenv("RANKWATCH_LOG_READER")
    merge = open_merge(files)
    assert isinstance(merge, PrefetchedMerge)
    assert _drain(merge) == _drain(EventLogMerge(files))


@pytest.mark.parametrize("seed", range(4))
def test_what_the_child_prepares_comes_with_its_batch(tmp_path: Path, seed: int) -> None:
    """With ``prepare`` the child sends its result with each batch, and the lines as one blob the parent slices
    (:class:`Lines`): the same batches, lines and sources as the in-process merge."""
    files = _files(tmp_path, seed)
    for chunk in (16, 300, 1 << 22):
        expected = _drain(EventLogMerge(files, chunk_bytes=chunk))
        merge = PrefetchedMerge(files, chunk_bytes=chunk, prepare=_lengths)
        got, made = [], []
        try:
            for kinds, values, sources, rows in batches_with_rows(merge):
                assert isinstance(values, Lines)
                got.append((kinds, list(values), [sources(i) for i in range(len(values))]))
                made.append(rows)
        finally:
            merge.close()
        assert got == expected, chunk
        assert made == [[len(v) for v in values] for _, values, _ in expected]


@pytest.mark.parametrize("seed", range(4))
def test_lines_the_parent_does_not_need_stay_in_the_child(tmp_path: Path, seed: int) -> None:
    """Where ``lines_needed`` says no, the batch comes with its rows and sources but not its lines (their number
    only: reading one is an error); elsewhere with its lines, as before."""
    files = _files(tmp_path, seed)
    expected = _drain(EventLogMerge(files, chunk_bytes=300))

    def odd_length(made: list[int], n: int) -> bool:  # some batches need their lines, some not
        assert made and len(made) == n
        return n % 2 == 1

    merge = PrefetchedMerge(files, chunk_bytes=300, prepare=_lengths, lines_needed=odd_length)
    got, unsent = [], 0
    try:
        for (kinds, values, sources, rows), (e_kinds, e_values, e_sources) in zip(
                batches_with_rows(merge), expected, strict=True):
            assert (kinds, len(values), rows) == (e_kinds, len(e_values), [len(v) for v in e_values])
            assert [sources(i) for i in range(len(values))] == e_sources
            if len(values) % 2:
                assert list(values) == e_values
            else:
                assert isinstance(values, Unsent)
                unsent += 1
                with pytest.raises(RuntimeError, match="not sent"):
                    values[0]
            got.append(kinds)
    finally:
        merge.close()
    assert len(got) == len(expected)
    if any(len(v) % 2 == 0 for _, v, _ in expected):
        assert unsent


@pytest.mark.parametrize("seed", range(4))
def test_batches_through_a_small_ring_reuse_its_space_and_lose_nothing(tmp_path: Path, seed: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches travel through shared memory (consumers/handoff.py's ring), whose space the child reuses once
    the parent asked for the batch after: with a ring of a few batches (wrapping around many times) and batches
    too large for it (through the pipe), the same batches, lines and rows as the in-process merge."""
    import rankwatch.commands.log_reader as log_reader
    from rankwatch.consumers.handoff import RequestRing

    files = _files(tmp_path, seed)
    for chunk, ring_bytes in ((16, 4096), (300, 4096), (300, 512), (1 << 22, 1 << 20)):
        monkeypatch.setattr(log_reader.RequestRing, "open", classmethod(
            lambda cls, size=ring_bytes: RequestRing(size=size, directory=tmp_path)))
        expected = _drain(EventLogMerge(files, chunk_bytes=chunk))
        merge = PrefetchedMerge(files, chunk_bytes=chunk, prepare=_lengths)
        got, made = [], []
        try:
            for kinds, values, sources, rows in batches_with_rows(merge):
                got.append((kinds, list(values), [sources(i) for i in range(len(values))]))
                made.append(rows)
            shared = merge.shared_batches
        finally:
            merge.close()
        assert got == expected, chunk
        assert made == [[len(v) for v in values] for _, values, _ in expected]
        if expected and ring_bytes >= 4096:
            assert shared > 0, "no batch went through the ring"
        if expected and ring_bytes == 512:
            assert shared < len(expected), "every batch fitted: the pipe's way was not taken"
        assert not list(tmp_path.glob("rankwatch-core-*")), "the ring's file was left behind"


def test_lines_index_and_slice_as_the_list_of_lines() -> None:
    rng = random.Random(4)
    for _ in range(300):
        lines = [bytes(rng.randrange(97, 100) for _ in range(rng.randrange(4))) for _ in range(rng.randrange(12))]
        view = Lines(b"".join(lines), array("i", map(len, lines)).tobytes())
        assert len(view) == len(lines) and list(view) == lines
        for i in range(-len(lines), len(lines)):
            assert view[i] == lines[i]
        a, b, step = rng.randrange(-14, 14), rng.randrange(-14, 14), rng.choice([None, 1, 2, -1, -3])
        assert view[a:b] == lines[a:b] and view[a:] == lines[a:] and view[:b] == lines[:b]
        assert view[a:b:step] == lines[a:b:step]
        with pytest.raises(IndexError):
            view[len(lines)]


def test_the_child_prepares_only_while_it_is_a_batch_ahead(tmp_path: Path) -> None:
    """``caught_up()`` is true while the parent has asked for every batch handed over (the first batch: it asks
    at once; the second: it holds the first), false once a batch handed over waits for it (the child is ahead;
    up to a deadline to get there)."""
    path = tmp_path / "imp.jsonl"
    path.write_bytes(b"\n".join(_random_line(random.Random(3), t) for t in range(3000)) + b"\n")
    looks = multiprocessing.get_context("fork").RawArray("b", [-1] * 64)  # batch -> caught_up() at its start

    def prepare(kinds: list[bool], values: list[bytes], caught_up: Any) -> None:
        looks[prepare.batch] = int(caught_up())  # type: ignore[attr-defined]
        prepare.batch += 1  # type: ignore[attr-defined]

    prepare.batch = 0  # type: ignore[attr-defined]
    merge = PrefetchedMerge([(path, "impressions")], chunk_bytes=4096, prepare=prepare)
    try:
        batches = batches_with_rows(merge)
        next(batches)
        deadline = time.monotonic() + 60
        while looks[3] == -1 and time.monotonic() < deadline:  # the child works ahead: batches 1 to 3
            time.sleep(0.01)
        assert looks[0] == 1 and looks[1] == 1 and looks[2] == 0 and looks[3] == 0
        n = 1 + sum(1 for _ in batches)
        assert n > 4 and all(looks[i] in (0, 1) for i in range(n)) and looks[n] == -1
    finally:
        merge.close()

