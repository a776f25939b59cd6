"""The feed path of a partition pair: the timestamp merge of its two buffers, handed to the core in one call.

:func:`feed_pair` is the body of :meth:`consumers.alignment.PartitionPair.feed` (the merge rules are
documented there). It collects the merged records' kinds, values and offsets into three flat lists and
calls :meth:`StreamProcessor.process_batch` once, instead of one ``process_impression`` /
``process_feedback`` call and one :class:`SourceRef` per record (issue 10, docs/benchmarks.md). The core's
result is identical: ``process_batch`` equals the per-record calls in the same order, and the merge
decisions depend on timestamps and the buffers only, never on what the core did with earlier records.
``next_offset`` of a topic becomes the offset after its last record in the batch once the core has
processed the batch, so a checkpoint still stores only what was fed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwatch.pipeline.published import PublishedWindow

# ``pair`` is a :class:`consumers.alignment.PartitionPair` (typed ``Any``: alignment imports this module).
PartitionPair = Any


def feed_pair(pair: PartitionPair, caught_up: Callable[[Any], bool], confirmed: Callable[[Any], bool],
              limit: int) -> tuple[list[PublishedWindow], int]:
    """Merge-feed ``pair``'s buffered records (at most ``limit``); returns the windows and the count fed."""
    imp_tp, clk_tp = pair.impressions_tp, pair.clicks_tp
    imp, clk = pair.buffers[imp_tp], pair.buffers[clk_tp]
    last_ts = pair.last_ts
    kinds: list[bool] = []
    values: list[bytes] = []
    offsets: list[int] = []
    add_kind, add_value, add_offset = kinds.append, values.append, offsets.append
    last_imp = last_clk = None
    fed = 0
    while fed < limit:
        if imp and clk:
            # The common case: a run of one topic up to the other's head (a tie: the impression first).
            head = clk[0].timestamp
            while imp and fed < limit and imp[0].timestamp <= head:
                last_imp = rec = imp.popleft()
                add_kind(True)
                add_value(rec.value or b"")
                add_offset(rec.offset)
                fed += 1
            if imp and fed < limit:
                head = imp[0].timestamp
                while clk and fed < limit and clk[0].timestamp < head:
                    last_clk = rec = clk.popleft()
                    add_kind(False)
                    add_value(rec.value or b"")
                    add_offset(rec.offset)
                    fed += 1
            continue
        # One buffer is empty: its last fed timestamp decides how far the other may go.
        if last_imp is not None:
            last_ts[imp_tp] = last_imp.timestamp
        if last_clk is not None:
            last_ts[clk_tp] = last_clk.timestamp
        if imp:
            if not pair._may_overtake(imp[0].timestamp, clk_tp, caught_up, confirmed):
                break
            last_imp = rec = imp.popleft()
            add_kind(True)
        elif clk:
            if not pair._may_overtake(clk[0].timestamp, imp_tp, caught_up, confirmed):
                break
            last_clk = rec = clk.popleft()
            add_kind(False)
        else:
            break
        add_value(rec.value or b"")
        add_offset(rec.offset)
        fed += 1
    out = pair.processor.process_batch(kinds, values, partition=pair.partition, offsets=offsets,
                                       topics=(imp_tp.topic, clk_tp.topic)) if fed else []
    if last_imp is not None:
        pair.next_offset[imp_tp] = last_imp.offset + 1
        last_ts[imp_tp] = last_imp.timestamp
    if last_clk is not None:
        pair.next_offset[clk_tp] = last_clk.offset + 1
        last_ts[clk_tp] = last_clk.timestamp
    pair.fed_since_checkpoint += fed
    return out, fed
