"""The result document of SPEC section 4, built from aggregates."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.slicing import SliceKey

MapEntries = Callable[[Callable[[RankingAggregate], dict[str, Any]], Iterable[RankingAggregate]],
                      Iterator[dict[str, Any]]]


def result_document(overall: RankingAggregate, slices: dict[SliceKey, RankingAggregate], *,
                    map_entries: MapEntries = map) -> dict[str, Any]:
    """``{"overall": {...}, "slices": [{"segment": ..., "surface": ..., "requests": ..., ...}]}``.

    Slices are sorted by their key so the document is deterministic. Every entry carries a
    ``"stderr"`` object with the standard error of each metric (same keys as the values, null where
    undefined; see :mod:`pipeline.metrics.uncertainty`). ``map_entries`` computes the entries (the
    builtin ``map``, or a thread pool's: each entry reads only its own aggregate, and their sorts release
    the GIL); the document is the same either way.
    """
    keys = sorted(slices)
    overall_entry, *slice_entries = map_entries(entry, [overall, *(slices[k] for k in keys)])
    return {
        "overall": overall_entry,
        "slices": [{**dict(key), **e} for key, e in zip(keys, slice_entries, strict=True)],
    }


def entry(agg: RankingAggregate) -> dict[str, Any]:
    """One entry of the document: counts, metric values, click-through by rank and the ``"stderr"`` block."""
    return {**agg.values(), **agg.position_values(), "stderr": agg.stderrs()}
