"""Finalized buckets waiting for one kernel call, kept as plain lists until their group is handed over.

The same contract as :class:`pipeline.stream.windows.FinalizedStaging` (read its docstring: groups of
``request_ts // group_ms``, handed to the kernel when complete, at ``max_items`` or on flush, so every
window's float sums are independent of arrival order), with one difference in cost: a finalized bucket
arrives as :class:`pipeline.stream.join.FinalizedLists` and stays lists until its group is popped, when
:func:`pipeline.stream.join.materialize` builds the numpy arrays once. When a Kafka backlog is replayed at low
traffic per partition, the watermark advances a 1 s step every few requests, and the earlier per-bucket
arrays (eight small numpy calls per bucket) were most of the cost of a step (docs/benchmarks.md).
The kernel sees exactly the arrays the per-bucket path built (``FinalizedBatch.concat`` of the buckets).
"""

from __future__ import annotations

from typing import Any

from rankwatch.pipeline.stream.join import FinalizedBatch, FinalizedLists, materialize


class ListStaging:
    """Staged groups of finalized requests (see module docstring); snapshot format of FinalizedStaging."""

    def __init__(self, *, group_ms: int, attribution_window_ms: int, max_items: int = 200_000) -> None:
        self.group_ms = group_ms
        self.attribution_window_ms = attribution_window_ms
        self.max_items = max_items
        self.groups: dict[int, list[FinalizedLists | FinalizedBatch]] = {}
        self.items: dict[int, int] = {}

    def add(self, part: FinalizedLists) -> list[FinalizedBatch]:
        """Stage a finalized bucket; returns groups that reached ``max_items``."""
        g = self.group_ms
        out = []
        while part.request_ids:
            k = part.ts_ms[0] // g
            if part.ts_ms[-1] // g == k:  # the usual case: the whole bucket in one group (ts ascends)
                head, part = part, FinalizedLists([], [], [], [], [], [], [], 0)
            else:
                at = next(i for i, t in enumerate(part.ts_ms) if t // g != k)
                head, part = part.split(at)
            self.groups.setdefault(k, []).append(head)
            self.items[k] = self.items.get(k, 0) + head.n_items
            if self.items[k] >= self.max_items:
                out.append(self._pop(k))
        return out

    def complete(self, watermark_ms: int | None) -> list[FinalizedBatch]:
        """Pop the groups that can receive no more requests (all when ``watermark_ms`` is None)."""
        if not self.groups or (watermark_ms is not None and watermark_ms < self.first_due()):
            return []
        keys = sorted(
            k for k in self.groups
            if watermark_ms is None or (k + 1) * self.group_ms + self.attribution_window_ms <= watermark_ms
        )
        return [self._pop(k) for k in keys]

    def first_due(self) -> int:
        """The watermark at which the earliest staged group is complete."""
        return (min(self.groups) + 1) * self.group_ms + self.attribution_window_ms

    def _pop(self, k: int) -> FinalizedBatch:
        del self.items[k]
        return _to_batch(self.groups.pop(k))

    def to_state(self) -> list[Any]:
        return [[k, [_to_batch(parts).to_state()]] for k, parts in self.groups.items()]

    def load_state(self, state: list[Any]) -> None:
        for k, batches in state:
            self.groups[int(k)] = [FinalizedBatch.from_state(b) for b in batches]
            self.items[int(k)] = sum(b.n_items for b in self.groups[int(k)])  # type: ignore[union-attr]


def _to_batch(parts: list[FinalizedLists | FinalizedBatch]) -> FinalizedBatch:
    """One batch of the group's parts in order: runs of lists materialized at once, restored arrays as is."""
    batches: list[FinalizedBatch] = []
    run: list[FinalizedLists] = []
    for p in parts:
        if isinstance(p, FinalizedLists):
            run.append(p)
            continue
        if run:
            batches.append(materialize(run))
            run = []
        batches.append(p)
    if run:
        batches.append(materialize(run))
    return FinalizedBatch.concat(batches)
