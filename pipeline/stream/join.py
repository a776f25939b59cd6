"""The impression-feedback join: a compact, columnar store of requests awaiting finalization.

Layout (one *slot* per pending request; slots are reused through a free list):

- ``index``: ``request_id -> slot`` (the only per-request dict entry),
- fixed columns in ``array`` s: ``ts`` (int64 request_ts = earliest impression ts), ``combo`` (int32 id
  of the capped slice labels) and ``count`` (uint16 items),
- variable columns, one Python object per request, never one per item: ``record`` (one ``bytes``: the
  float64 scores in position order, then the UTF-8 item ids joined by NUL), ``positions`` (``None`` when the items
  are exactly positions ``1..n``, the common list-form case, else a sorted ``array('i')``) and
  ``feedback`` (``None`` or a small list of ``(item_id, grade, ts_ms, counted)``).

A 20-item list-form request costs about 600 bytes (~30 bytes per item); see docs/benchmarks.md.

Requests are grouped into *finalization buckets* of ``step_ms`` by their deadline
``request_ts + attribution_window``: bucket ``b`` holds deadlines in ``[b*step, (b+1)*step)``. Buckets are
finalized whole and in order, so which requests are finalized together does not depend on arrival order
(the sums in the windows come out bit-identical however the events were shuffled within the allowed
disorder). Bucket lists may hold stale slots (a request whose request_ts moved earlier, or a freed and
reused slot); :meth:`PendingRequests.take_bucket` filters them.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.events.records import Feedback, Impression
from rankwatch.pipeline.events.validation import Rejection, RejectReason, _in_order
from rankwatch.pipeline.stream import native

SEP = "\x00"  # item ids never contain NUL (validation rejects them)
USER_KEY_CACHE = 1 << 16  # entries of PendingRequests.user_keys before it is emptied
_STRUCTS: dict[int, struct.Struct] = {}


def _pack_scores(scores: tuple[float, ...]) -> bytes:
    n = len(scores)
    st = _STRUCTS.get(n)
    if st is None:
        st = _STRUCTS[n] = struct.Struct(f"<{n}d")
    return st.pack(*scores)


# One pending feedback: item id, grade, feedback ts, and whether it was already counted as accepted.
FeedbackEntry = tuple[str, int, int, bool]


@dataclass
class FinalizedBatch:
    """Flat lists of finalized requests, ready for the kernel (each list in served-position order)."""

    request_ids: list[str]
    ts_ms: npt.NDArray[np.int64]
    combo: npt.NDArray[np.int64]
    labels: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]
    offsets: npt.NDArray[np.int64]
    feedback_accepted: int = 0  # feedback decided only now (it predated its request's ts when it came)
    feedback_late: int = 0  # ... and found outside the attribution window
    feedback_detached: int = 0  # counted accepted on arrival, outside the window of the final request_ts
    users: npt.NDArray[np.int64] | None = None  # 64-bit key of each request's user (GAUC group)

    @property
    def n_requests(self) -> int:
        return int(self.ts_ms.size)

    @property
    def n_items(self) -> int:
        return int(self.scores.size)

    def select(self, keep: npt.NDArray[np.bool_]) -> FinalizedBatch:
        """The requests where ``keep`` is true (request ids are not carried over)."""
        lengths = np.diff(self.offsets)
        item_keep = np.repeat(keep, lengths)
        offsets = np.concatenate(([0], np.cumsum(lengths[keep]))).astype(np.int64)
        return FinalizedBatch([], self.ts_ms[keep], self.combo[keep], self.labels[item_keep],
                              self.scores[item_keep], offsets,
                              users=None if self.users is None else self.users[keep])
    @staticmethod
    def concat(batches: list[FinalizedBatch]) -> FinalizedBatch:
        """All requests of ``batches``, in order (request ids are not carried over)."""
        if len(batches) == 1:
            return batches[0]
        lengths = np.concatenate([np.diff(b.offsets) for b in batches])
        return FinalizedBatch(
            [], np.concatenate([b.ts_ms for b in batches]), np.concatenate([b.combo for b in batches]),
            np.concatenate([b.labels for b in batches]), np.concatenate([b.scores for b in batches]),
            np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
            users=None if any(b.users is None for b in batches)
            else np.concatenate([b.users for b in batches if b.users is not None]),
        )

    def to_state(self) -> list[bytes]:
        users = () if self.users is None else (self.users,)  # optional sixth column
        return [a.astype(a.dtype.newbyteorder("<")).tobytes()
                for a in (self.ts_ms, self.combo, self.labels, self.scores, self.offsets, *users)]

    @classmethod
    def from_state(cls, state: list[bytes]) -> FinalizedBatch:
        ts, combo, labels, scores, offsets = (
            np.frombuffer(b, dtype=d).astype(d.lstrip("<"))
            for b, d in zip(state[:5], ("<i8", "<i8", "<f8", "<f8", "<i8"), strict=True)
        )
        users = np.frombuffer(state[5], dtype="<i8").astype(np.int64) if len(state) > 5 else None
        return cls([], ts, combo, labels, scores, offsets, users=users)


@dataclass(slots=True)
class FinalizedLists:
    """A finalized bucket as plain lists (what :func:`materialize` turns into a :class:`FinalizedBatch`).

    Requests are in ``(request_ts, request_id)`` order, so ``ts_ms`` ascends; ``score_parts[r]`` is request
    ``r``'s float64 scores as bytes; ``label_at`` are flat item indices into the concatenated items.
    """

    request_ids: list[str]
    ts_ms: list[int]
    combo: list[int]
    lengths: list[int]
    score_parts: list[bytes]
    label_at: list[int]
    label_grade: list[int]
    n_items: int
    feedback_accepted: int = 0
    feedback_late: int = 0
    feedback_detached: int = 0
    users: list[int] | None = None  # user_key() of each request (the GAUC group)

    @property
    def n_requests(self) -> int:
        return len(self.request_ids)

    def split(self, at: int) -> tuple[FinalizedLists, FinalizedLists]:
        """The requests before index ``at`` and from it on (counters stay with the first part)."""
        cut = sum(self.lengths[:at])
        first = [i for i, a in enumerate(self.label_at) if a < cut]
        second = [i for i, a in enumerate(self.label_at) if a >= cut]
        return (
            FinalizedLists(self.request_ids[:at], self.ts_ms[:at], self.combo[:at], self.lengths[:at],
                           self.score_parts[:at], [self.label_at[i] for i in first],
                           [self.label_grade[i] for i in first], cut, self.feedback_accepted, self.feedback_late,
                           self.feedback_detached, None if self.users is None else self.users[:at]),
            FinalizedLists(self.request_ids[at:], self.ts_ms[at:], self.combo[at:], self.lengths[at:],
                           self.score_parts[at:], [self.label_at[i] - cut for i in second],
                           [self.label_grade[i] for i in second], self.n_items - cut,
                           users=None if self.users is None else self.users[at:]),
        )


def materialize(parts: list[FinalizedLists]) -> FinalizedBatch:
    """One :class:`FinalizedBatch` of ``parts`` in order (equal to ``FinalizedBatch.concat`` of each one's)."""
    ts: list[int] = []
    combo: list[int] = []
    lengths: list[int] = []
    scores_b: list[bytes] = []
    label_at: list[int] = []
    label_grade: list[int] = []
    request_ids: list[str] = []
    users: list[int] | None = [] if all(p.users is not None for p in parts) else None
    base = 0
    for p in parts:
        if users is not None and p.users is not None:
            users += p.users
        ts += p.ts_ms
        combo += p.combo
        lengths += p.lengths
        scores_b += p.score_parts
        request_ids += p.request_ids
        label_at += [base + a for a in p.label_at] if base else p.label_at
        label_grade += p.label_grade
        base += p.n_items
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    scores = np.frombuffer(b"".join(scores_b), dtype="<f8").astype(np.float64)
    labels = np.zeros(scores.size, dtype=np.float64)
    if label_at:
        np.maximum.at(labels, np.array(label_at, dtype=np.intp), np.array(label_grade, dtype=np.float64))
    return FinalizedBatch(request_ids, np.array(ts, dtype=np.int64), np.array(combo, dtype=np.int64), labels, scores,
                          offsets, sum(p.feedback_accepted for p in parts), sum(p.feedback_late for p in parts),
                          sum(p.feedback_detached for p in parts),
                          None if users is None else np.array(users, dtype=np.int64))


def finalize_labels_py(records: Sequence[bytes], lengths: Sequence[int],
                       feedback: Sequence[tuple[FeedbackEntry, ...] | None], ts_ms: Sequence[int],
                       attribution_window_ms: int) -> tuple[list[bytes], list[int], list[int], int, int, int]:
    """``(score_parts, label_at, label_grade, accepted, late, detached)`` of finalized requests: each record's scores
    as bytes; each feedback inside its request's attribution window labels every position showing its item (a flat
    index into the requests' items, in order) with its grade, and is accepted now if it was not counted on arrival;
    outside, it is detached if it was counted, else late.

    The Python loop of the finalize step: the fallback of pipeline/stream/_labels.c (its ``finalize``), and its
    oracle in the tests."""
    att = attribution_window_ms
    score_parts = [rec[: 8 * n] for rec, n in zip(records, lengths, strict=True)]
    label_at: list[int] = []  # flat item index ...
    label_grade: list[int] = []  # ... and a grade attributed to it
    accepted = late = detached = 0
    ends = list(accumulate(lengths))
    for i, fb in enumerate(feedback):
        if fb is None:
            continue
        n, rts = lengths[i], ts_ms[i]
        base = ends[i] - n
        ids: list[str] | None = None
        for item, grade, fts, counted in fb:
            if not rts <= fts <= rts + att:
                if counted:
                    detached += 1
                else:
                    late += 1
                continue
            if not counted:
                accepted += 1
            if ids is None:
                ids = records[i][8 * n :].decode().split(SEP)
            shown = ids.count(item)
            if shown:
                at = ids.index(item)
                label_at.append(base + at)
                label_grade.append(grade)
                if shown > 1:  # the item shown at several positions: label every one
                    for k in range(at + 1, n):
                        if ids[k] == item:
                            label_at.append(base + k)
                            label_grade.append(grade)
    return score_parts, label_at, label_grade, accepted, late, detached


class PendingRequests:
    """Pending requests in packed columns, bucketed by finalization deadline."""

    def __init__(self, *, attribution_window_ms: int, step_ms: int, max_items_per_request: int) -> None:
        self.attribution_window_ms = attribution_window_ms
        self.step_ms = step_ms
        self.max_items = max_items_per_request
        self.index: dict[str, int] = {}
        self.rid: list[str | None] = []
        self.ts = array("q")
        self.combo = array("i")
        self.user = array("q")  # user_key() of the request's first impression
        # One bytes object per request: float64 scores (8 * n bytes), then the UTF-8 item ids joined by NUL.
        self.record: list[bytes | None] = []
        self.count = array("H")  # items per request (max_items_per_request <= 65535)
        self.positions: list[array[int] | None] = []
        # A tuple, not a list: tuples of atomic values leave the garbage collector's tracking, and a full
        # collection over one list per pending request cost about a quarter of the core's time.
        self.feedback: list[tuple[FeedbackEntry, ...] | None] = []
        self.free: list[int] = []
        self.buckets: dict[int, list[int]] = {}
        self.bucket_heap: list[int] = []
        self.n_items = 0
        # user_id -> user_key_of it, for the batch path: users come back request after request, and the
        # BLAKE2b of each request's user cost about 3 % of the core. Not state (rebuilt on demand);
        # emptied when it reaches USER_KEY_CACHE entries, so it stays bounded (about 4 MB plus the ids).
        self.user_keys: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.index)

    def bucket_of(self, ts_ms: int) -> int:
        return (ts_ms + self.attribution_window_ms) // self.step_ms

    def _file(self, slot: int, ts_ms: int) -> None:
        b = (ts_ms + self.attribution_window_ms) // self.step_ms
        lst = self.buckets.get(b)
        if lst is None:
            self.buckets[b] = [slot]
            heapq.heappush(self.bucket_heap, b)
        else:
            lst.append(slot)

    # -- adding ----------------------------------------------------------------------------------------
    def add(self, imp: Impression, combo: int) -> int:
        """A new pending request from its first impression; returns the slot."""
        n = len(imp.scores)
        ids, scores, positions = imp.item_ids, imp.scores, imp.positions
        pos_col: array[int] | None = None
        if positions != _in_order(n):
            # Positions are distinct (validated), so tuples sort by position alone.
            positions, ids, scores = zip(*sorted(zip(positions, ids, scores, strict=True)), strict=True)  # type: ignore[assignment]
            if positions != _in_order(n):
                pos_col = array("i", positions)
        packed = _pack_scores(scores) + SEP.join(ids).encode()
        if self.free:
            slot = self.free.pop()
            self.rid[slot] = imp.request_id
            self.ts[slot] = imp.ts_ms
            self.combo[slot] = combo
            self.user[slot] = user_key(imp)
            self.record[slot] = packed
            self.count[slot] = n
            self.positions[slot] = pos_col
            self.feedback[slot] = None
        else:
            slot = len(self.rid)
            self.rid.append(imp.request_id)
            self.ts.append(imp.ts_ms)
            self.combo.append(combo)
            self.user.append(user_key(imp))
            self.record.append(packed)
            self.count.append(n)
            self.positions.append(pos_col)
            self.feedback.append(None)
        self.index[imp.request_id] = slot
        self.n_items += n
        lst = self.buckets.get((imp.ts_ms + self.attribution_window_ms) // self.step_ms)
        if lst is not None:  # _file, inlined for the usual case of an existing bucket
            lst.append(slot)
        else:
            self._file(slot, imp.ts_ms)
        return slot

    def extend(self, slot: int, imp: Impression) -> Rejection | None:
        """Add more items (item form, or a second list) to a pending request."""
        rec = self.record[slot]
        assert rec is not None
        have = self.count[slot]
        n = len(imp.scores)
        if have + n > self.max_items:
            return Rejection(RejectReason.too_many_items, f"request would have {have + n} items > {self.max_items}")
        pos = self.positions[slot]
        if pos is None:
            pos = array("i", range(1, have + 1))
        taken = set(pos)
        if any(p in taken for p in imp.positions) or len(set(imp.positions)) != n:
            return Rejection(RejectReason.duplicate_position, "position already filled for this request")
        # Merge in position order now (a rare path), so finalization never sorts.
        ids = rec[8 * have :].decode().split(SEP) + list(imp.item_ids)
        scores = struct.unpack(f"<{have}d", rec[: 8 * have]) + tuple(imp.scores)
        positions = list(pos) + list(imp.positions)
        order = sorted(range(have + n), key=positions.__getitem__)
        self.positions[slot] = array("i", [positions[i] for i in order])
        self.record[slot] = _pack_scores(tuple(scores[i] for i in order)) + SEP.join([ids[i] for i in order]).encode()
        self.count[slot] = have + n
        self.n_items += n
        if imp.ts_ms < self.ts[slot]:
            self.ts[slot] = imp.ts_ms
            self._file(slot, imp.ts_ms)
        return None

    def add_feedback(self, slot: int, entry: FeedbackEntry) -> None:
        fb = self.feedback[slot]
        self.feedback[slot] = (entry,) if fb is None else (*fb, entry)

    # -- finalizing ------------------------------------------------------------------------------------
    def next_bucket(self) -> int | None:
        return self.bucket_heap[0] if self.bucket_heap else None

    def take_bucket(self) -> list[int]:
        """Pop the earliest bucket; its live slots (deduplicated), sorted by (request_ts, request_id)."""
        b = heapq.heappop(self.bucket_heap)
        raw = self.buckets.pop(b)
        att, step, rid, ts = self.attribution_window_ms, self.step_ms, self.rid, self.ts
        live = {s for s in raw if rid[s] is not None and (ts[s] + att) // step == b}
        if len(live) < 2:
            return list(live)
        pick = itemgetter(*live)  # (ts, request id, slot) tuples made in C: no key function called a slot
        return [s for _, _, s in sorted(zip(pick(ts), pick(rid), live, strict=True))]

    def finalize(self, slots: list[int]) -> FinalizedBatch:
        """Remove ``slots`` and return their flat, labelled arrays (:meth:`finalize_lists`, materialized)."""
        return materialize([self.finalize_lists(slots)])

    def finalize_lists(self, slots: list[int]) -> FinalizedLists:
        """Remove ``slots`` and return their flat, labelled lists, without numpy (cheap for small buckets).

        Labels are gathered as flat ``(item index, grade)`` pairs and written with one ``np.maximum.at``
        when the lists are materialized (the label of an item is the largest grade attributed to it), so
        requests without feedback cost no per-item work and requests with feedback no per-request array.
        """
        att = self.attribution_window_ms
        records, feedback, index, rids, positions = self.record, self.feedback, self.index, self.rid, self.positions
        if not slots:
            return FinalizedLists([], [], [], [], [], [], [], 0, users=[])
        # One C call a column (an itemgetter of every slot), not a comprehension of index lookups each.
        pick = itemgetter(*slots) if len(slots) > 1 else (lambda column: (column[slots[0]],))
        lengths: list[int] = list(pick(self.count))
        ts_list: list[int] = list(pick(self.ts))
        request_ids: list[str] = list(pick(rids))
        # the score parts, labels and counters: in C where it was built (pipeline/stream/native.py)
        finalize = finalize_labels_py if native.labels is None else native.labels.finalize
        score_parts, label_at, label_grade, accepted, late, detached = finalize(
            pick(records), lengths, pick(feedback), ts_list, att)
        for rid in request_ids:  # release the slots
            del index[rid]
        for slot in slots:
            rids[slot] = records[slot] = positions[slot] = feedback[slot] = None
        self.free += slots
        n_items = sum(lengths)
        self.n_items -= n_items
        return FinalizedLists(request_ids, ts_list, list(pick(self.combo)), lengths, score_parts,
                              label_at, label_grade, n_items, accepted, late, detached,
                              list(pick(self.user)))  # the requests' user keys

    # -- snapshot --------------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Live requests only, sorted by slot order of (request_ts, request_id); buckets are rebuilt."""
        slots = sorted(self.index.values(), key=lambda s: (self.ts[s], self.rid[s]))
        return {
            "rid": [self.rid[s] for s in slots],
            "ts": [self.ts[s] for s in slots],
            "combo": [self.combo[s] for s in slots],
            "user": [self.user[s] for s in slots],
            "record": [self.record[s] for s in slots],
            "count": [self.count[s] for s in slots],
            "positions": [None if self.positions[s] is None else self.positions[s].tobytes() for s in slots],  # type: ignore[union-attr]
            "feedback": [self.feedback[s] for s in slots],
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], *, attribution_window_ms: int, step_ms: int, max_items_per_request: int
    ) -> PendingRequests:
        out = cls(attribution_window_ms=attribution_window_ms, step_ms=step_ms, max_items_per_request=max_items_per_request)
        for i, rid in enumerate(state["rid"]):
            out.rid.append(rid)
            out.ts.append(int(state["ts"][i]))
            out.combo.append(int(state["combo"][i]))
            out.user.append(int(state["user"][i]) if "user" in state else 0)
            out.record.append(bytes(state["record"][i]))
            out.count.append(int(state["count"][i]))
            pos = state["positions"][i]
            out.positions.append(None if pos is None else array("i", bytes(pos)))
            fb = state["feedback"][i]
            out.feedback.append(None if fb is None else tuple([(str(a), int(b), int(c), bool(d)) for a, b, c, d in fb]))
            out.index[rid] = i
            out.n_items += out.count[i]
            out._file(i, out.ts[i])
        return out


def user_key(imp: Impression) -> int:
    """A stable 64-bit key of the impression's user (the GAUC group); without a ``user_id``,
    a key of the request itself, so such a request is a group of its own rather than one "unknown" user."""
    return user_key_of(imp.request_id, imp.user_id)


def user_key_of(request_id: str, user_id: str | None) -> int:
    """:func:`user_key` from the two fields (the batch path has them on the wire struct)."""
    text = "u:" + user_id if user_id else "r:" + request_id
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def feedback_entry(fb: Feedback, counted: bool) -> FeedbackEntry:
    return (fb.item_id, fb.grade, fb.ts_ms, counted)
