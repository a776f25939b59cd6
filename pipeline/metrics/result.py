"""The result document of SPEC section 4, built from aggregates."""

from __future__ import annotations

from typing import Any

from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.slicing import SliceKey


def result_document(overall: RankingAggregate, slices: dict[SliceKey, RankingAggregate]) -> dict[str, Any]:
    """``{"overall": {...}, "slices": [{"segment": ..., "surface": ..., "requests": ..., ...}]}``.

    Slices are sorted by their key so the document is deterministic. Every entry carries a
    ``"stderr"`` object with the standard error of each metric (same keys as the values, null where
    undefined; see :mod:`pipeline.metrics.uncertainty`).
    """
    return {
        "overall": entry(overall),
        "slices": [{**dict(key), **entry(agg)} for key, agg in sorted(slices.items())],
    }


def entry(agg: RankingAggregate) -> dict[str, Any]:
    """One entry of the document: counts, metric values, click-through by rank and the ``"stderr"`` block."""
    return {**agg.values(), **agg.position_values(), "stderr": agg.stderrs()}
