"""The batch path of the streaming core: a poll's records in one call, equal to per-record processing.

:func:`process_batch` takes the records of one partition pair in the order the per-record calls would
see them (``kinds[i]`` true for an impression, false for feedback) and gives exactly the windows, counts,
dead letters and state of calling :meth:`StreamProcessor.process_impression` / ``process_feedback`` on
each in turn (``tests/pipeline/stream/test_stream_golden.py`` and a hypothesis test check this). The time goes:

- two passes: :func:`pipeline.stream.prepare.prepare_rows` decodes, checks and packs the *clean* records
  without reading any state (a list-form impression with positions ``1..n``, in order or not, and feedback
  with an int timestamp; scores with one ``struct.pack``, ids with one ``join``, as
  :meth:`PendingRequests.add` would), then one loop here applies the rows in order; a caller may hand in
  rows made elsewhere (``rankwatch replay`` makes them in its log reader's process);
- the apply loop binds every lookup to a local and makes no per-event :class:`Impression` /
  :class:`Feedback` / :class:`SourceRef` objects;
- everything else (bad lines, item form, RFC 3339 times, NUL escapes, a second impression of a request,
  the pending cap) goes through the per-record method *before* any state changed, so it is exact by
  construction;
- the watermark is observed only when an event could move it: ``ts`` above the largest one already seen
  on that partition since the last tick (the per-record path does the same without partitions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream import native
from rankwatch.pipeline.stream.prepare import PreparedRows, prepare_rows
from rankwatch.pipeline.stream.watermark import _ANY, Watermark

# ``proc`` below is a :class:`pipeline.stream.processor.StreamProcessor`; it is typed ``Any`` because importing it,
# even for type checking only, would make the two modules import each other (tests/rankwatch/test_packaging.py).
StreamProcessor = Any

_TOPICS = ("impressions", "clicks")
_PART = 512  # records prepared, then applied, at a time


def process_batch(
    proc: StreamProcessor,
    kinds: Sequence[bool],
    values: Sequence[bytes],
    *,
    partition: int | None = None,
    offsets: Sequence[int] | None = None,
    topics: tuple[str, str] = _TOPICS,
    source_of: Callable[[int], SourceRef] | None = None,
    rows: PreparedRows | None = None,
) -> list[PublishedWindow]:
    """Process ``values`` in order (see module docstring); ``offsets`` and ``topics`` name the sources.

    With ``offsets`` each event's :class:`SourceRef` is ``(topics[0 if impression else 1], partition,
    offsets[i])``, built only when needed (dead letters); without them no source is attached, exactly as
    the per-record calls with ``source=None`` (``partition`` must then be None too). ``source_of(i)``,
    when given, names record ``i``'s source instead (a file and line for a replay), also only when needed.
    ``rows`` are ``prepare_rows(proc.batch_spec, kinds, values)`` when the caller made them already, or
    the rows of its first ``rows.n_records`` records (the rest are made here).
    """
    if offsets is None and partition is not None:
        raise ValueError("partition needs offsets")
    out: list[PublishedWindow] = []
    done = 0
    apply = _apply if native.fastapply is None else _apply_native
    if rows is not None:
        out += apply(proc, kinds, values, rows, 0, partition, offsets, topics, source_of)
        done = rows.n_records
    # The rest in parts of _PART records, each prepared, then applied: a part's rows are still in the CPU's
    # caches when applied (one pass over a 4,096-record poll's rows cost about 8 % more).
    spec, user_keys = proc.batch_spec, proc._pending.user_keys
    for start in range(done, len(kinds), _PART):
        stop = start + _PART
        part = prepare_rows(spec, kinds[start:stop], values[start:stop], user_keys)
        out += apply(proc, kinds, values, part, start, partition, offsets, topics, source_of)
    return out


def _apply_native(proc: StreamProcessor, kinds: Sequence[bool], values: Sequence[bytes], rows: PreparedRows,
                  first: int, partition: int | None, offsets: Sequence[int] | None, topics: tuple[str, str],
                  source_of: Callable[[int], SourceRef] | None) -> list[PublishedWindow]:
    """:func:`_apply` with its common event applied in C (pipeline/stream/_fastapply.c): the C loop runs until an
    event it leaves, which :func:`_apply` applies alone, and so on to the end of the rows."""
    run = native.fastapply.run  # type: ignore[union-attr]
    out: list[PublishedWindow] = []
    pending, seen, wmk, early, wire_combo = proc._pending, proc._seen, proc._watermark, proc._early, proc._wire_combo
    imp_counts, clk_counts = proc._imp, proc._clk
    kind_list = kinds if type(kinds) is list else list(kinds)
    imp_rows, fb_rows = rows.impressions, rows.feedback
    i, ip, fp, end = first, 0, 0, first + rows.n_records
    while True:
        skip = -1 if wmk.partitioned else proc._skip_observe_upto  # as _apply starts
        ikey = _inline_key(wmk, partition)
        if ikey is not None:
            skip = wmk.max_ts[ikey]  # type: ignore[assignment]
        # what the loop reads and writes, read again after each event left to Python (it may replace an object)
        state = (kind_list, imp_rows, fb_rows, pending.index, proc.config.max_pending_requests, seen.ids,
                 seen.capacity, wmk.max_ts, wmk, wmk.allowed_disorder_ms, proc._step, proc._attr, proc._finalized.ids,
                 wire_combo, pending.free, pending.rid, pending.ts, pending.combo, pending.user, pending.record,
                 pending.count, pending.positions, pending.feedback, pending.buckets, pending.attribution_window_ms,
                 pending.step_ms, early.by_request, pending._file)
        (i, ip, fp, skip, added, i_dup, i_late, i_acc, f_dup, f_late, f_acc, f_orphan) = run(
            state, i, end, ip, fp, skip, ikey, proc._wm_step, seen.tail, seen.tail_tag, early.count)
        pending.n_items += added
        imp_counts["duplicate"] += i_dup
        imp_counts["late"] += i_late
        imp_counts["accepted"] += i_acc
        clk_counts["duplicate"] += f_dup
        clk_counts["late"] += f_late
        clk_counts["accepted"] += f_acc
        clk_counts["orphan"] += f_orphan
        if not wmk.partitioned:
            proc._skip_observe_upto = skip
        if i >= end:
            return out
        if kind_list[i]:  # the event the loop left, applied by _apply alone
            one = PreparedRows(1, [[c[ip]] for c in imp_rows], [[] for _ in fb_rows])
            ip += 1
        else:
            one = PreparedRows(1, [[] for _ in imp_rows], [[c[fp]] for c in fb_rows])
            fp += 1
        out += _apply(proc, kinds, values, one, i, partition, offsets, topics, source_of)
        i += 1


def _apply(proc: StreamProcessor, kinds: Sequence[bool], values: Sequence[bytes], rows: PreparedRows, first: int,
           partition: int | None, offsets: Sequence[int] | None, topics: tuple[str, str],
           source_of: Callable[[int], SourceRef] | None) -> list[PublishedWindow]:
    """Apply ``rows``, the rows of records ``first, first + 1, ...`` of the batch, in order (the stateful half)."""
    out: list[PublishedWindow] = []
    cfg = proc.config
    pending = proc._pending
    # a row at a time; zip reuses its tuple once the row is unpacked, so nothing new for the garbage collector
    impressions, feedback = zip(*rows.impressions, strict=True), zip(*rows.feedback, strict=True)
    max_pending = cfg.max_pending_requests
    attr = proc._attr
    seen, finalized_ids = proc._seen, proc._finalized.ids
    seen_ids = seen.ids
    index, p_ts, p_fb = pending.index, pending.ts, pending.feedback
    early = proc._early
    imp_counts, clk_counts = proc._imp, proc._clk
    wmk = proc._watermark
    partitioned = wmk.partitioned
    p_key = None if partition is None else partition
    wire_combo = proc._wire_combo  # wire label tuple (None for absent) -> combo, for labels needing no folding
    skip = -1 if partitioned else proc._skip_observe_upto
    max_ts, disorder, step = wmk.max_ts, wmk.allowed_disorder_ms, proc._step
    ikey = _inline_key(wmk, p_key)
    if ikey is not None:
        skip = max_ts[ikey]  # type: ignore[assignment]
    slow_imp, slow_fb = proc.process_impression, proc.process_feedback
    # The pending store's columns, for a new request's slot written here (PendingRequests.add for rows already in
    # position order, inlined: a method call and its attribute loads were a tenth of the loop).
    free, p_rid, p_combo, p_user = pending.free, pending.rid, pending.combo, pending.user
    p_record, p_count, p_positions = pending.record, pending.count, pending.positions
    buckets, p_attr, p_step, file_slot = pending.buckets, pending.attribution_window_ms, pending.step_ms, pending._file
    added_items = 0
    observe = proc._observe_at
    cap = seen.capacity
    # The watermark step and the dedupe set's newest group, read again only after a call that can change them (a
    # watermark step, the per-record path, a new group): attribute loads an event fewer.
    def fresh() -> tuple[int | None, int | None, Callable[[str], None]]:
        return proc._wm_step, seen.tail_tag, seen.tail.append

    ws, tail_tag, tail_append = fresh()

    for i in range(first, first + rows.n_records):
        if kinds[i]:
            # -- impression ------------------------------------------------------------------------
            eid, rid, ts, key, n, packed, ukey = next(impressions)
            if eid is None or rid in index or len(index) >= max_pending:
                src = (source_of(i) if source_of is not None
                       else None if offsets is None else SourceRef(topics[0], partition, offsets[i]))  # type: ignore[arg-type]
                out += slow_imp(values[i], source=src)
                skip, ikey = _resync(proc, wmk, p_key)
                ws, tail_tag, tail_append = fresh()
                continue
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
                    if ws is None or v >= ws + step:
                        out += proc._maybe_advance(v)
                        ws, tail_tag, tail_append = fresh()
                else:
                    out += observe(p_key, ts)
                    ws, tail_tag, tail_append = fresh()
                    skip = _skip_after(proc, wmk, p_key)
                    ikey = _inline_key(wmk, p_key)
                    if ikey is not None:
                        skip = max_ts[ikey]  # type: ignore[assignment]
            tag = ws or 0
            if tag == tail_tag and len(seen_ids) < cap:
                seen_ids.add(eid)
                tail_append(eid)
            else:
                seen.add(eid, tag)
                tail_tag, tail_append = seen.tail_tag, seen.tail.append
            if (ws is not None and ts + attr < ws) or rid in finalized_ids:
                imp_counts["late"] += 1
                continue
            combo = wire_combo.get(key)
            if combo is None:
                combo = _combo_of_wire(proc, key)
            if free:
                slot = free.pop()
                p_rid[slot], p_ts[slot], p_combo[slot], p_user[slot] = rid, ts, combo, ukey
                p_record[slot], p_count[slot], p_positions[slot], p_fb[slot] = packed, n, None, None
            else:
                slot = len(p_rid)
                p_rid.append(rid), p_ts.append(ts), p_combo.append(combo), p_user.append(ukey)
                p_record.append(packed), p_count.append(n), p_positions.append(None), p_fb.append(None)
            index[rid] = slot
            added_items += n
            lst = buckets.get((ts + p_attr) // p_step)
            if lst is not None:
                lst.append(slot)
            else:
                file_slot(slot, ts)
            if early.count and rid in early.by_request:
                for entry in early.pop(rid):
                    proc._attach(slot, entry)
            imp_counts["accepted"] += 1
        else:
            # -- feedback --------------------------------------------------------------------------
            eid, frid, fitem, fts, grade = next(feedback)
            if eid is None:
                src = (source_of(i) if source_of is not None
                       else None if offsets is None else SourceRef(topics[1], partition, offsets[i]))  # type: ignore[arg-type]
                out += slow_fb(values[i], source=src)
                skip, ikey = _resync(proc, wmk, p_key)
                ws, tail_tag, tail_append = fresh()
                continue
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
                    if ws is None or v >= ws + step:
                        out += proc._maybe_advance(v)
                        ws, tail_tag, tail_append = fresh()
                else:
                    out += observe(p_key, fts)
                    ws, tail_tag, tail_append = fresh()
                    skip = _skip_after(proc, wmk, p_key)
                    ikey = _inline_key(wmk, p_key)
                    if ikey is not None:
                        skip = max_ts[ikey]  # type: ignore[assignment]
            tag = ws or 0
            if tag == tail_tag and len(seen_ids) < cap:
                seen_ids.add(eid)
                tail_append(eid)
            else:
                seen.add(eid, tag)
                tail_tag, tail_append = seen.tail_tag, seen.tail.append
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
            elif ws is not None and fts + attr < ws:
                clk_counts["orphan"] += 1
            else:
                if early.count >= cfg.max_pending_feedback:
                    clk_counts["orphan"] += early.evict_oldest()
                early.add(frid, (fitem, grade, fts, False))
    pending.n_items += added_items
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
