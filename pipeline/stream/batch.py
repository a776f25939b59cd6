"""The batch path of the streaming core: a poll's records in one call, equal to per-record processing.

:func:`process_batch` takes the records of one partition pair in the order the per-record calls would
see them (``kinds[i]`` true for an impression, false for feedback) and gives exactly the windows, counts,
dead letters and state of calling :meth:`StreamProcessor.process_impression` / ``process_feedback`` on
each in turn (``tests/pipeline/stream/test_stream_golden.py`` and a hypothesis test check this). The time goes:

- one loop with every lookup bound to a local, no per-event :class:`Impression` / :class:`Feedback` /
  :class:`SourceRef` objects, no per-event Python calls beyond the C decoder;
- the *clean* cases run inline: a list-form impression with positions ``1..n`` in order that opens a new
  request, and feedback with an int timestamp. Their decoded wire struct is packed straight into the
  pending columns (scores with one ``struct.pack``, ids with one ``join``), as :meth:`PendingRequests.add`
  would;
- everything else (bad lines, item form, RFC 3339 times, NUL escapes, a second impression of a request,
  the pending cap) goes through the per-record method *before* any state changed, so it is exact by
  construction;
- the watermark is observed only when an event could move it: ``ts`` above the largest one already seen
  on that partition since the last tick (the per-record path does the same without partitions).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import _FEEDBACK_DECODER, _IMPRESSION_DECODER, MAX_GRADE, MAX_TS_MS
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.join import _STRUCTS, SEP, USER_KEY_CACHE, _pack_scores, user_key_of
from rankwatch.pipeline.stream.watermark import _ANY, Watermark

# ``proc`` below is a :class:`pipeline.stream.processor.StreamProcessor`; it is typed ``Any`` because importing it,
# even for type checking only, would make the two modules import each other (tests/rankwatch/test_packaging.py).
StreamProcessor = Any

_TOPICS = ("impressions", "clicks")


def process_batch(
    proc: StreamProcessor,
    kinds: Sequence[bool],
    values: Sequence[bytes],
    *,
    partition: int | None = None,
    offsets: Sequence[int] | None = None,
    topics: tuple[str, str] = _TOPICS,
    source_of: Callable[[int], SourceRef] | None = None,
) -> list[PublishedWindow]:
    """Process ``values`` in order (see module docstring); ``offsets`` and ``topics`` name the sources.

    With ``offsets`` each event's :class:`SourceRef` is ``(topics[0 if impression else 1], partition,
    offsets[i])``, built only when needed (dead letters); without them no source is attached, exactly as
    the per-record calls with ``source=None`` (``partition`` must then be None too). ``source_of(i)``,
    when given, names record ``i``'s source instead (a file and line for a replay), also only when needed.
    """
    if offsets is None and partition is not None:
        raise ValueError("partition needs offsets")
    out: list[PublishedWindow] = []
    cfg = proc.config
    max_bytes, max_items = cfg.max_event_bytes, cfg.max_items_per_request
    max_pending = cfg.max_pending_requests
    dec_imp, dec_fb = _IMPRESSION_DECODER.decode, _FEEDBACK_DECODER.decode
    grades = proc._grades
    attr = proc._attr
    seen, finalized_ids = proc._seen, proc._finalized.ids
    seen_ids = seen.ids
    pending = proc._pending
    index, p_ts, p_fb = pending.index, pending.ts, pending.feedback
    early = proc._early
    imp_counts, clk_counts = proc._imp, proc._clk
    in_order = pending._seq
    wmk = proc._watermark
    partitioned = wmk.partitioned
    p_key = None if partition is None else partition
    by = proc._by
    labels_of = operator.attrgetter(*by) if len(by) > 1 else (lambda w: tuple([getattr(w, lbl) for lbl in by]))
    wire_combo = proc._wire_combo  # wire label tuple (None for absent) -> combo, for labels needing no folding
    skip = -1 if partitioned else proc._skip_observe_upto
    max_ts, disorder, step = wmk.max_ts, wmk.allowed_disorder_ms, proc._step
    ikey = _inline_key(wmk, p_key)
    if ikey is not None:
        skip = max_ts[ikey]  # type: ignore[assignment]
    slow_imp, slow_fb = proc.process_impression, proc.process_feedback
    add_packed = pending.add_packed
    user_keys = pending.user_keys
    observe = proc._observe_at
    nul = b"\\u0000"
    backslash = b"\\"  # any JSON escape (the NUL one too) starts with it: one memchr, ~4x cheaper than the search
    by_position = operator.attrgetter("position")

    for i, raw in enumerate(values):
        if kinds[i]:
            # -- impression ------------------------------------------------------------------------
            w: Any = None
            if len(raw) <= max_bytes and raw.isascii() and (backslash not in raw or nul not in raw):
                try:
                    w = dec_imp(raw)
                except Exception:  # noqa: BLE001 - the per-record path names the reason
                    w = None
            if w is not None:
                ts = w.ts
                items = w.items
                rid = w.request_id
                if type(rid) is not str:  # an integer id reads as its decimal text (SPEC section 1)
                    rid = str(rid)
                if (type(ts) is not int or not 0 <= ts <= MAX_TS_MS or items is None or w.item_id is not None
                        or w.position is not None or w.score is not None or rid in index):
                    w = None
                else:
                    n = len(items)
                    if not 0 < n <= max_items or len(index) >= max_pending:
                        w = None
                    elif tuple([it.position for it in items]) != in_order[n]:
                        # Items listed out of position order: sorted, they are fine if positions are 1..n.
                        items = sorted(items, key=by_position)
                        if tuple([it.position for it in items]) != in_order[n]:
                            w = None
            if w is None:
                src = (source_of(i) if source_of is not None
                       else None if offsets is None else SourceRef(topics[0], partition, offsets[i]))  # type: ignore[arg-type]
                out += slow_imp(raw, source=src)
                skip, ikey = _resync(proc, wmk, p_key)
                continue
            eid = w.event_id
            if type(eid) is not str:
                eid = str(eid)
            if eid in seen_ids:
                imp_counts["duplicate"] += 1
                continue
            if ts > skip:
                if ikey is not None:  # Watermark.observe + _observe_at for the one live partition, inlined
                    skip = max_ts[ikey] = ts
                    wm = ts - disorder
                    v = wmk.value
                    if v is None or wm > v:
                        wmk.value = v = wm
                    ws = proc._wm_step
                    if ws is None or v >= ws + step:
                        out += proc._maybe_advance(v)
                else:
                    out += observe(p_key, ts)
                    skip = _skip_after(proc, wmk, p_key)
                    ikey = _inline_key(wmk, p_key)
                    if ikey is not None:
                        skip = max_ts[ikey]  # type: ignore[assignment]
            tag = proc._wm_step or 0
            if tag == seen.tail_tag and len(seen_ids) < seen.capacity:
                seen_ids.add(eid)
                seen.tail.append(eid)
            else:
                seen.add(eid, tag)
            ws = proc._wm_step
            if (ws is not None and ts + attr < ws) or rid in finalized_ids:
                imp_counts["late"] += 1
                continue
            key = labels_of(w)
            combo = wire_combo.get(key)
            if combo is None:
                combo = _combo_of_wire(proc, key)
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
            slot = add_packed(rid, ts, combo, packed, n, ukey)
            if early.count and rid in early.by_request:
                for entry in early.pop(rid):
                    proc._attach(slot, entry)
            imp_counts["accepted"] += 1
        else:
            # -- feedback --------------------------------------------------------------------------
            f: Any = None
            if len(raw) <= max_bytes and raw.isascii() and (backslash not in raw or nul not in raw):
                try:
                    f = dec_fb(raw)
                except Exception:  # noqa: BLE001 - the per-record path names the reason
                    f = None
            if f is not None:
                fts = f.ts
                grade = f.grade
                if grade is None:
                    grade = None if f.action is None else grades.get(f.action)
                if type(fts) is not int or not 0 <= fts <= MAX_TS_MS or grade is None or not 0 <= grade <= MAX_GRADE:
                    f = None
            if f is None:
                src = (source_of(i) if source_of is not None
                       else None if offsets is None else SourceRef(topics[1], partition, offsets[i]))  # type: ignore[arg-type]
                out += slow_fb(raw, source=src)
                skip, ikey = _resync(proc, wmk, p_key)
                continue
            eid = f.event_id
            if type(eid) is not str:
                eid = str(eid)
            if eid in seen_ids:
                clk_counts["duplicate"] += 1
                continue
            if fts > skip:
                if ikey is not None:  # Watermark.observe + _observe_at for the one live partition, inlined
                    skip = max_ts[ikey] = fts
                    wm = fts - disorder
                    v = wmk.value
                    if v is None or wm > v:
                        wmk.value = v = wm
                    ws = proc._wm_step
                    if ws is None or v >= ws + step:
                        out += proc._maybe_advance(v)
                else:
                    out += observe(p_key, fts)
                    skip = _skip_after(proc, wmk, p_key)
                    ikey = _inline_key(wmk, p_key)
                    if ikey is not None:
                        skip = max_ts[ikey]  # type: ignore[assignment]
            tag = proc._wm_step or 0
            if tag == seen.tail_tag and len(seen_ids) < seen.capacity:
                seen_ids.add(eid)
                seen.tail.append(eid)
            else:
                seen.add(eid, tag)
            frid, fitem = f.request_id, f.item_id
            if type(frid) is not str:
                frid = str(frid)
            if type(fitem) is not str:
                fitem = str(fitem)
            fslot = index.get(frid)
            if fslot is not None:
                rts = p_ts[fslot]
                if fts > rts + attr:
                    clk_counts["late"] += 1
                else:
                    counted = fts >= rts
                    if counted:
                        clk_counts["accepted"] += 1
                    held = p_fb[fslot]
                    p_fb[fslot] = ((fitem, grade, fts, counted),) if held is None else (
                        *held, (fitem, grade, fts, counted))
            elif frid in finalized_ids:
                clk_counts["late"] += 1
            elif proc._wm_step is not None and fts + attr < proc._wm_step:
                clk_counts["orphan"] += 1
            else:
                if early.count >= cfg.max_pending_feedback:
                    clk_counts["orphan"] += early.evict_oldest()
                early.add(frid, (fitem, grade, fts, False))
    if not partitioned:
        proc._skip_observe_upto = skip
    return out


def _inline_key(wmk: Watermark, partition: int | None) -> int | None:
    """The watermark's one partition key when :meth:`Watermark.observe` reduces to ``max(value, ts -
    disorder)`` for this batch's events: a single partition (or none), already seen since the last tick,
    not idle, with a ``max_ts``. Else None (the full ``observe`` runs)."""
    key = partition if wmk.partitioned else _ANY
    if wmk.partitions != (key,) or key not in wmk.seen_since_tick or key in wmk.idle or wmk.max_ts.get(key) is None:
        return None
    return key


def _resync(proc: StreamProcessor, wmk: Watermark, partition: int | None) -> tuple[int, int | None]:
    """``skip`` and ``ikey`` after a per-record call (which may have observed a later ts)."""
    ikey = _inline_key(wmk, partition)
    if ikey is not None:
        return wmk.max_ts[ikey], ikey  # type: ignore[return-value]
    return _skip_after(proc, wmk, partition), None


def _skip_after(proc: StreamProcessor, wmk: Watermark, partition: int | None) -> int:
    """The largest ts that can no longer change the watermark until the next tick.

    Without partitions that is the processor's own ``_skip_observe_upto``. With partitions, an event of
    partition ``p`` at or below ``max_ts[p]`` only re-marks ``p`` as seen and not idle, which it already
    is right after an observe; an unknown partition never moves anything.
    """
    if not proc._watermark.partitioned:
        return proc._skip_observe_upto
    w = proc._watermark
    p = -1 if partition is None else partition
    if p not in w.max_ts:
        return 2**63  # a partition the watermark was not told about: observe changes nothing
    cur = w.max_ts[p]
    return cur if cur is not None and p in w.seen_since_tick and p not in w.idle else -1


def _combo_of_wire(proc: StreamProcessor, key: tuple[str | None, ...]) -> int:
    """The combo of a wire label tuple (absent or empty labels are ``"unknown"``), cached when no label folded."""
    raw = tuple(v or "unknown" for v in key)
    cached = proc._combo_cache.get(raw)
    if cached is not None:
        proc._wire_combo[key] = cached
        return cached
    combo = proc._combo_raw(raw)
    if raw in proc._combo_cache:
        proc._wire_combo[key] = combo
    return combo
