"""The periodic checkpoint in two steps (consumers/committer.py: ``Committer.periodic``), without a broker.

A fake service (lock, pairs, a store that acknowledges at once, a consumer that records commits) around
the real :class:`Committer`: the offsets and ``fed`` are those at ask time, nothing is written before
every snapshot is answered, and a cancel (rebalance, synchronous checkpoint), a replaced pair, a stop or
an outage while the answers are pending never commit a stale checkpoint.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from rankwatch.consumers.answer import Answer
from rankwatch.consumers.checkpoints import CheckpointRef
from rankwatch.consumers.committer import Committer


class _Processor:
    """A remote processor's stand-in: its snapshots are answered when the test says so."""

    def __init__(self, state: list[int]) -> None:
        self.state = state
        self.asked: list[tuple[Answer, bytes]] = []

    def snapshot(self) -> bytes:
        return bytes(self.state)

    def snapshot_async(self) -> Answer:
        answer = Answer()
        self.asked.append((answer, self.snapshot()))  # what the core holds at ask time
        return answer

    def answer_all(self) -> None:
        for answer, snap in self.asked:
            answer.fill(snap, None)
        self.asked.clear()


class _Service:
    def __init__(self, partitions: range) -> None:
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._outage = SimpleNamespace(active=False, succeeded=lambda: None)
        self._dead = None
        self.sent: list[tuple[int, bytes, int, int]] = []
        self.commits: list[dict[Any, Any]] = []
        self._store = SimpleNamespace(send=self._send, acknowledged=lambda out, **_: out, delete=lambda p, ref: None)
        self._producer = object()
        self._consumer = SimpleNamespace(commit=lambda offsets, **_: self.commits.append(offsets))
        self._pairs = {p: self.pair(p) for p in partitions}

    @staticmethod
    def pair(p: int) -> Any:
        imp, clk = ("imp", p), ("clk", p)
        return SimpleNamespace(partition=p, impressions_tp=imp, clicks_tp=clk, next_offset={imp: 10, clk: 5},
                               buffers={imp: [], clk: []}, processor=_Processor([p]), fed_since_checkpoint=3,
                               checkpoint=None)

    def _send(self, p: int, snapshot: bytes, *, impressions_offset: int, clicks_offset: int, previous: Any) -> Any:
        self.sent.append((p, snapshot, impressions_offset, clicks_offset))
        return CheckpointRef(f"id{len(self.sent)}", len(self.sent), 1)

    def _step(self, step: str, fn: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        return True, fn(*args, **kwargs)


def _periodic(c: Committer, svc: _Service, *, due: bool) -> bool:
    return c.periodic(lambda: [p for p, pair in svc._pairs.items() if pair.fed_since_checkpoint], due=due,
                      timeout_s=1.0)


def test_offsets_and_fed_are_those_at_ask_time_and_nothing_is_written_before_every_answer() -> None:
    svc = _Service(range(2))
    c = Committer(svc)
    assert not _periodic(c, svc, due=False) and c.asked is None
    assert not _periodic(c, svc, due=True)  # asked, not answered
    for pair in svc._pairs.values():  # the loop feeds on meanwhile
        pair.next_offset = {pair.impressions_tp: 20, pair.clicks_tp: 9}
        pair.fed_since_checkpoint += 4
        pair.processor.state.append(99)
    svc._pairs[0].processor.answer_all()
    assert not _periodic(c, svc, due=True) and svc.sent == []  # one answer still missing
    svc._pairs[1].processor.answer_all()
    assert _periodic(c, svc, due=False)
    assert svc.sent == [(0, bytes([0]), 10, 5), (1, bytes([1]), 10, 5)]
    (offsets,) = svc.commits
    assert {tp: o.offset for tp, o in offsets.items()} == {("imp", 0): 10, ("clk", 0): 5, ("imp", 1): 10, ("clk", 1): 5}
    assert [pair.fed_since_checkpoint for pair in svc._pairs.values()] == [4, 4]  # only what the checkpoint holds
    assert [pair.checkpoint.checkpoint_id for pair in svc._pairs.values()] == ["id1", "id2"]
    assert c.written == 2 and c.asked is None


def test_a_cancel_discards_the_asked_snapshots_and_a_synchronous_checkpoint_cancels() -> None:
    svc = _Service(range(2))
    c = Committer(svc)
    _periodic(c, svc, due=True)
    asked = [a for pair in svc._pairs.values() for a, _ in pair.processor.asked]
    c.checkpoint([0, 1], in_listener=True)  # the listener's: waits, replaces the pending one
    assert c.asked is None and all(a.cancelled for a in asked)
    for pair in svc._pairs.values():
        pair.processor.answer_all()  # the discarded answers come in
    assert not _periodic(c, svc, due=False) and svc.commits == []  # the listener commits its own, not this
    assert len(svc.sent) == 2


def test_a_replaced_pair_a_stop_or_an_outage_while_pending_write_nothing_stale() -> None:
    svc = _Service(range(2))
    c = Committer(svc)
    _periodic(c, svc, due=True)
    old = svc._pairs[1]
    svc._pairs[1] = svc.pair(1)  # restored meanwhile: a new processor
    for pair in (svc._pairs[0], old):
        pair.processor.answer_all()
    assert _periodic(c, svc, due=False)
    assert [s[0] for s in svc.sent] == [0] and set(svc.commits[0]) == {("imp", 0), ("clk", 0)}
    for stop, outage in ((True, False), (False, True)):
        svc.sent.clear()
        _periodic(c, svc, due=True)
        svc._stop.set() if stop else svc._stop.clear()
        svc._outage.active = outage
        for pair in svc._pairs.values():
            pair.processor.answer_all()
        failures = c.failures
        assert _periodic(c, svc, due=False) and svc.sent == [] and len(svc.commits) == 1
        assert c.failures == failures + (1 if outage else 0)  # an outage: a failed checkpoint, next interval


def test_in_process_processors_complete_in_the_same_turn() -> None:
    svc = _Service(range(1))
    svc._pairs[0].processor = SimpleNamespace(snapshot=lambda: b"state")  # no snapshot_async: in-process
    c = Committer(svc)
    assert _periodic(c, svc, due=True) and svc.sent == [(0, b"state", 10, 5)] and len(svc.commits) == 1
