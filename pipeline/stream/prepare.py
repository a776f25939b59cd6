"""The stateless half of the batch path: a poll's clean records decoded, checked and packed, one row each.

Layout: :class:`BatchSpec` (the settings the rows depend on, from a :class:`StreamConfig`),
:func:`prepare_rows`, which turns ``values`` into one row per record, and :class:`PreparedRows`, the rows
as columns:

- a clean impression: ``(event_id, request_id, ts_ms, wire_labels, n_items, packed, user_key)``, with
  ``packed`` the :class:`pipeline.stream.join.PendingRequests` ``record`` column (float64 scores in position
  order, then the item ids joined by NUL) and ``user_key`` :func:`pipeline.stream.join.user_key_of`;
- clean feedback: ``(event_id, request_id, item_id, ts_ms, grade)``;
- an event id of ``None`` for anything else (bad bytes, a time out of range or without a zone, an item-form
  impression, a NUL escape, ...): :func:`pipeline.stream.batch.process_batch` hands it to the per-record method,
  which names the reason.

Why apart: nothing here reads the processor's state, so the rows can be made anywhere. ``process_batch``
makes them in-process, then applies them in order (dedupe, watermark, join); ``rankwatch replay`` makes them
in its log reader's child process, on the second core, while the core applies the batch before
(rankwatch/commands/log_reader.py). The same function makes the rows in both places, so a replay equals the
per-record calls by the same argument as the batch path does.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Any, NamedTuple

from rankwatch.pipeline.events.validation import (
    _FEEDBACK_DECODER,
    _IMPRESSION_DECODER,
    MAX_GRADE,
    MAX_TS_MS,
    _event_ts,
    _in_order,
)
from rankwatch.pipeline.stream import native
from rankwatch.pipeline.stream.join import _STRUCTS, SEP, USER_KEY_CACHE, _pack_scores, user_key_of

_LABEL_FIELDS = ("segment", "surface", "variant", "model")  # the scanner's order of the label fields
_SCANNED_ITEMS = 65535  # the scanner's largest max_items_per_request (StreamConfig's too)
_IMPRESSION_FIELDS = 7  # event_id, request_id, ts_ms, wire_labels, n_items, packed, user_key
_FEEDBACK_FIELDS = 5  # event_id, request_id, item_id, ts_ms, grade


class PreparedRows(NamedTuple):
    """The rows of a batch's first ``n_records`` records, as columns: ``impressions`` holds one list a field with
    one entry an impression among them, ``feedback`` the same for feedback; a record left to the per-record
    path has ``None`` as its event id (its other fields are placeholders).

    Columns, not a tuple a row: a list of strings and ints is one object for the garbage collector, where
    a tuple a record made it walk hundreds of thousands more (about a tenth of a replay)."""

    n_records: int
    impressions: list[list[Any]]
    feedback: list[list[Any]]

    @staticmethod
    def concat(parts: Sequence[PreparedRows]) -> PreparedRows:
        """The rows of consecutive ``parts`` of a batch, in order."""
        return PreparedRows(sum(p.n_records for p in parts),
                            [list(chain.from_iterable(c)) for c in zip(*(p.impressions for p in parts), strict=True)],
                            [list(chain.from_iterable(c)) for c in zip(*(p.feedback for p in parts), strict=True)])


    def packed(self) -> PackedRows:
        """These rows as a dozen flat objects, for a pipe (:meth:`PackedRows.unpacked` gives them back, equal)."""
        eid, rid, ts, labels, n, packed, user = self.impressions
        f_eid, f_rid, f_item, f_ts, f_grade = self.feedback
        distinct: dict[Any, int] = {}
        codes = array("i", [distinct.setdefault(lbl, len(distinct)) for lbl in labels])
        records = [p or b"" for p in packed]  # a row left to the per-record path has none
        return PackedRows(self.n_records, _joined(eid + rid), array("q", ts + n + user).tobytes(), list(distinct),
                          codes.tobytes(), b"".join(records), array("i", map(len, records)).tobytes(), _slow(eid),
                          _joined(f_eid + f_rid + f_item), array("q", f_ts + f_grade).tobytes(), _slow(f_eid))


class PackedRows(NamedTuple):
    """:class:`PreparedRows` as a dozen flat objects, for a pipe (``rankwatch replay``'s reader hands its rows on so).

    Each column of ids is one NUL-joined string (a clean row's ids hold no NUL: such a line goes to the per-record
    path), the ints one ``array('q')`` a side, the ``packed`` records one blob with their lengths, the labels their
    distinct tuples and a code a row, and the rows left to the per-record path their indexes. Why: pickling the
    rows memoized one object a field a row; this pickles in about half the time (docs/benchmarks.md)."""

    n_records: int
    imp_ids: str  # event ids, then request ids
    imp_ints: bytes  # ts, then n_items, then user keys
    labels: list[Any]  # the distinct wire-label tuples
    label_codes: bytes
    records: bytes
    record_lengths: bytes
    imp_slow: bytes  # indexes (among the impressions) of the rows left to the per-record path
    fb_ids: str  # event ids, request ids, item ids
    fb_ints: bytes  # ts, then grades
    fb_slow: bytes
    missing: int = 0  # the kinds whose rows were not made (1: impressions, 2: feedback): see :meth:`completed`
    # The maker vouches that the core applies every clean row without reading its line (not a second impression
    # of a request it may hold, nor one at its pending cap: rankwatch/commands/rows_as_read.py RepeatGuard).
    vouched: bool = False

    @property
    def every_row_clean(self) -> bool:
        """No row is left to the per-record path."""
        return not self.imp_slow and not self.fb_slow

    def unpacked(self) -> PreparedRows:
        """The rows these were packed from."""
        ints = array("q", self.imp_ints).tolist()
        m = len(ints) // 3
        ids: list[Any] = self.imp_ids.split(SEP) if m else []
        eid, rid = ids[:m], ids[m:]
        labels: list[Any] = list(map(self.labels.__getitem__, array("i", self.label_codes)))
        blob = self.records
        ends = list(accumulate(array("i", self.record_lengths)))
        packed: list[bytes | None] = [blob[a:b] for a, b in zip(chain((0,), ends), ends, strict=False)]  # starts: one more
        for i in array("i", self.imp_slow):  # the placeholders prepare_rows writes for them
            eid[i] = rid[i] = labels[i] = packed[i] = None
        f_ints = array("q", self.fb_ints).tolist()
        k = len(f_ints) // 2
        f_ids: list[Any] = self.fb_ids.split(SEP) if k else []
        f_eid, f_rid, f_item = f_ids[:k], f_ids[k:2 * k], f_ids[2 * k:]
        for i in array("i", self.fb_slow):
            f_eid[i] = f_rid[i] = f_item[i] = None
        return PreparedRows(self.n_records, [eid, rid, ints[:m], labels, ints[m:2 * m], packed, ints[2 * m:]],
                            [f_eid, f_rid, f_item, f_ints[:k], f_ints[k:]])


    def completed(self, spec: BatchSpec, kinds: Sequence[bool], lines: Sequence[bytes],
                  user_keys: dict[str, int] | None = None) -> PreparedRows:
        """:meth:`unpacked`, with the rows of a kind not made (:attr:`missing`) made here from the batch's
        ``lines`` (of ``kinds``): all of that kind's, in order, as :func:`prepare_rows` makes them."""
        rows = self.unpacked()
        if not self.missing:
            return rows
        imp, fb = rows.impressions, rows.feedback
        every = lines[:len(kinds)]  # one slice: a blob of lines (log_reader.Lines) cuts them in one pass
        for bit, kind in ((1, True), (2, False)):
            if self.missing & bit:
                of_kind = [line for k, line in zip(kinds, every, strict=True) if k == kind]
                made = prepare_rows(spec, [kind] * len(of_kind), of_kind, user_keys)
                imp, fb = (made.impressions, fb) if kind else (imp, made.feedback)
        return PreparedRows(self.n_records, imp, fb)


def _joined(texts: list[Any]) -> str:
    """Clean rows' ids joined by NUL; a row left to the per-record path (None) as an empty string."""
    return SEP.join([t or "" for t in texts])


def _slow(event_ids: list[Any]) -> bytes:
    """The indexes of the rows left to the per-record path (their event id is None), as ``array('i')`` bytes."""
    return array("i", [i for i, e in enumerate(event_ids) if e is None]).tobytes()


@dataclass(frozen=True)
class BatchSpec:
    """What a row depends on: the size caps, the action grades and the slice labels read off the wire."""

    max_event_bytes: int
    max_items_per_request: int
    action_grades: tuple[tuple[str, int], ...]
    by: tuple[str, ...]

    @classmethod
    def of(cls, config: Any) -> BatchSpec:
        """The spec of a :class:`pipeline.stream.config.StreamConfig`."""
        return cls(config.max_event_bytes, config.max_items_per_request, tuple(dict(config.action_grades).items()),
                   tuple(config.slice_spec.by))


def prepare_rows(spec: BatchSpec, kinds: Sequence[bool], values: Sequence[bytes],
                 user_keys: dict[str, int] | None = None) -> PreparedRows:
    """The rows of every record of ``values`` (``kinds[i]``: impression?); see the module docstring.

    ``user_keys`` remembers ``user_id -> user_key_of`` across calls (emptied at :data:`USER_KEY_CACHE`
    entries): users come back request after request, and a BLAKE2b per request cost about 3 % of the core.

    The usual line is scanned in C (:mod:`pipeline.stream._rowscan`, where it was built:
    :mod:`pipeline.stream.native`); a line it leaves, and every line without it, gets its row from
    :func:`prepare_rows_msgspec`, which the scanner's rows equal.
    """
    if user_keys is None:
        user_keys = {}
    scanner = native.rowscan
    if scanner is None or not 0 < spec.max_items_per_request <= _SCANNED_ITEMS:
        return prepare_rows_msgspec(spec, kinds, values, user_keys)
    if len(kinds) != len(values):
        raise ValueError(f"{len(kinds)} kinds for {len(values)} values")
    n_imp = sum(kinds)
    if n_imp == len(kinds):
        imp_lines, fb_lines = list(values), []
    elif n_imp == 0:
        imp_lines, fb_lines = [], list(values)
    else:
        imp_lines = [v for k, v in zip(kinds, values, strict=True) if k]
        fb_lines = [v for k, v in zip(kinds, values, strict=True) if not k]
    labels: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    imp, left_imp = scanner.impressions(imp_lines, spec.max_event_bytes, spec.max_items_per_request,
                                         tuple([_LABEL_FIELDS.index(lbl) for lbl in spec.by]), labels, user_keys,
                                         USER_KEY_CACHE, user_key_of)
    fb, left_fb = scanner.feedback(fb_lines, spec.max_event_bytes, dict(spec.action_grades))
    if left_imp or left_fb:  # their rows by msgspec's path, put in their places
        left = [True] * len(left_imp) + [False] * len(left_fb)
        rest = prepare_rows_msgspec(spec, left, [imp_lines[i] for i in left_imp] + [fb_lines[i] for i in left_fb],
                                    user_keys, labels)
        for columns, made, where in ((imp, rest.impressions, left_imp), (fb, rest.feedback, left_fb)):
            for column, values_made in zip(columns, made, strict=True):
                for i, value in zip(where, values_made, strict=True):
                    column[i] = value
    return PreparedRows(len(values), imp, fb)


def prepare_rows_msgspec(spec: BatchSpec, kinds: Sequence[bool], values: Sequence[bytes], user_keys: dict[str, int],
                         labels: dict[tuple[Any, ...], tuple[Any, ...]] | None = None) -> PreparedRows:
    """:func:`prepare_rows` with msgspec's decoders for every line (the scanner's oracle); ``labels`` keeps one
    tuple per distinct labels."""
    max_bytes, max_items = spec.max_event_bytes, spec.max_items_per_request
    grades = dict(spec.action_grades)
    by = spec.by
    labels_of = operator.attrgetter(*by) if len(by) > 1 else (lambda w: tuple([getattr(w, lbl) for lbl in by]))
    dec_imp, dec_fb = _IMPRESSION_DECODER.decode, _FEEDBACK_DECODER.decode
    by_position = operator.attrgetter("position")
    nul = b"\\u0000"
    backslash = b"\\"  # any JSON escape (the NUL one too) starts with it: one memchr, ~4x cheaper than the search
    imp: list[list[Any]] = [[] for _ in range(_IMPRESSION_FIELDS)]
    fb: list[list[Any]] = [[] for _ in range(_FEEDBACK_FIELDS)]
    i_eid, i_rid, i_ts, i_labels, i_n, i_packed, i_user = (c.append for c in imp)
    f_eid, f_rid, f_item, f_ts, f_grade = (c.append for c in fb)
    if labels is None:
        labels = {}  # one tuple per distinct labels: the others are freed now

    def slow_impression() -> None:
        i_eid(None), i_rid(None), i_ts(0), i_labels(None), i_n(0), i_packed(None), i_user(0)

    def slow_feedback() -> None:
        f_eid(None), f_rid(None), f_item(None), f_ts(0), f_grade(0)

    for kind, raw in zip(kinds, values, strict=True):
        if len(raw) > max_bytes or not raw.isascii() or (backslash in raw and nul in raw):
            slow_impression() if kind else slow_feedback()
            continue
        if kind:
            try:
                w: Any = dec_imp(raw)
            except Exception:  # noqa: BLE001 - the per-record path names the reason
                slow_impression()
                continue
            ts = w.ts
            if type(ts) is not int:  # an RFC 3339 time: epoch ms as the per-record path reads it (else a Rejection)
                ts = _event_ts(ts)
            items = w.items
            if (type(ts) is not int or not 0 <= ts <= MAX_TS_MS or items is None or w.item_id is not None
                    or w.position is not None or w.score is not None or not 0 < (n := len(items)) <= max_items):
                slow_impression()
                continue
            if tuple([it.position for it in items]) != _in_order(n):
                # Items listed out of position order: sorted, they are fine if positions are 1..n.
                items = sorted(items, key=by_position)
                if tuple([it.position for it in items]) != _in_order(n):
                    slow_impression()
                    continue
            rid = w.request_id
            if type(rid) is not str:  # an integer id reads as its decimal text (SPEC section 1)
                rid = str(rid)
            eid = w.event_id
            if type(eid) is not str:
                eid = str(eid)
            st = _STRUCTS.get(n)
            try:
                joined = SEP.join([it.item_id for it in items])
            except TypeError:  # integer item ids: their decimal text
                joined = SEP.join([str(it.item_id) for it in items])
            packed = (_pack_scores(tuple([it.score for it in items])) if st is None
                      else st.pack(*[it.score for it in items])) + joined.encode()
            user = w.user_id
            if user:  # the GAUC group: user_key_of(rid, user), remembered per user
                if type(user) is not str:
                    user = str(user)
                ukey = user_keys.get(user)
                if ukey is None:
                    ukey = user_key_of(rid, user)
                    if len(user_keys) >= USER_KEY_CACHE:
                        user_keys.clear()
                    user_keys[user] = ukey
            else:
                ukey = user_key_of(rid, None if user is None else str(user))
            key = labels_of(w)
            i_eid(eid), i_rid(rid), i_ts(ts), i_labels(labels.setdefault(key, key)), i_n(n), i_packed(packed)
            i_user(ukey)
        else:
            try:
                f: Any = dec_fb(raw)
            except Exception:  # noqa: BLE001 - the per-record path names the reason
                slow_feedback()
                continue
            fts = f.ts
            if type(fts) is not int:
                fts = _event_ts(fts)
            grade = f.grade
            if grade is None:
                grade = None if f.action is None else grades.get(f.action)
            if type(fts) is not int or not 0 <= fts <= MAX_TS_MS or grade is None or not 0 <= grade <= MAX_GRADE:
                slow_feedback()
                continue
            eid, frid, fitem = f.event_id, f.request_id, f.item_id
            f_eid(eid if type(eid) is str else str(eid)), f_rid(frid if type(frid) is str else str(frid))
            f_item(fitem if type(fitem) is str else str(fitem)), f_ts(fts), f_grade(grade)
    return PreparedRows(len(values), imp, fb)

