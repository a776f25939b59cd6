"""The result document of SPEC section 4, built from aggregates."""

from __future__ import annotations

from typing import Any

from rankwatch.pipeline.aggregates import RankingAggregate
from rankwatch.pipeline.slicing import SliceKey


def result_document(overall: RankingAggregate, slices: dict[SliceKey, RankingAggregate]) -> dict[str, Any]:
    """``{"overall": {...}, "slices": [{"segment": ..., "surface": ..., "requests": ..., ...}]}``.

    Slices are sorted by their key so the document is deterministic.
    """
    return {
        "overall": {**overall.values(), **overall.position_values()},  # issue 13: + position_ctr, position_shown
        "slices": [{**dict(key), **agg.values(), **agg.position_values()} for key, agg in sorted(slices.items())],
    }
