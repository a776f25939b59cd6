"""Adding up the streaming core's statistics of several partition pairs (for one exporter per process)."""

from __future__ import annotations

from collections.abc import Sequence

from rankwatch.pipeline.stream import StreamStats


def merge_stats(parts: Sequence[StreamStats]) -> StreamStats:
    """Counters and gauges summed over ``parts``; the watermark is the minimum (the slowest pair).

    ``label_values`` is the maximum per label: each pair caps its labels on its own, so the sum would
    over-count values that several pairs share.
    """
    if not parts:
        raise ValueError("no statistics to merge")
    outcomes: dict[str, dict[str, int]] = {}
    rejects: dict[tuple[str, str], int] = {}
    label_values: dict[str, int] = {}
    label_overflow: dict[str, int] = {}
    windows: dict[str, int] = {}
    for s in parts:
        for stream, counts in s.outcomes.items():
            target = outcomes.setdefault(stream, {})
            for outcome, n in counts.items():
                target[outcome] = target.get(outcome, 0) + n
        for key, n in s.rejects.items():
            rejects[key] = rejects.get(key, 0) + n
        for label, n in s.label_values.items():
            label_values[label] = max(label_values.get(label, 0), n)
        for label, n in s.label_overflow.items():
            label_overflow[label] = label_overflow.get(label, 0) + n
        for w, n in s.windows_published.items():
            windows[w] = windows.get(w, 0) + n
    marks = [s.watermark_ms for s in parts]
    return StreamStats(
        outcomes=outcomes,
        rejects=rejects,
        pending_requests=sum(s.pending_requests for s in parts),
        pending_items=sum(s.pending_items for s in parts),
        pending_feedback=sum(s.pending_feedback for s in parts),
        watermark_ms=None if any(m is None for m in marks) else min(m for m in marks if m is not None),
        evicted_requests=sum(s.evicted_requests for s in parts),
        finalized_requests=sum(s.finalized_requests for s in parts),
        feedback_detached=sum(s.feedback_detached for s in parts),
        label_values=label_values,
        label_overflow=label_overflow,
        windows_published=windows,
        dedupe_ids=sum(s.dedupe_ids for s in parts),
        dedupe_forgotten_at_capacity=sum(s.dedupe_forgotten_at_capacity for s in parts),
    )
