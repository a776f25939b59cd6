"""The map / merge API: partial baselines of disjoint requests merge into the in-memory baseline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offline_data import assert_same_result, random_frame

from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import compute_baseline
from rankwatch.pipeline.offline.partial import (
    PartialBaseline,
    merge_partials,
    partial_baseline,
    partial_of_frame,
)
from rankwatch.pipeline.offline.readers import InvalidEvaluationData, validate_evaluation_frame
from rankwatch.pipeline.slicing import SliceSpec


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_requests=st.integers(1, 50), parts=st.integers(1, 6),
       cap=st.integers(1, 5), through_bytes=st.booleans())  # fmt: skip
def test_merged_partials_equal_the_in_memory_baseline(
    seed: int, n_requests: int, parts: int, cap: int, through_bytes: bool
) -> None:
    rng = np.random.default_rng(seed)
    frame = random_frame(rng, n_requests, position=seed % 2 == 0, model=seed % 3 == 0)
    options = MetricOptions(ndcg_cutoffs=(2, 20), map_cutoffs=(1, 4))
    spec = SliceSpec(by=("segment", "surface"), max_values_per_label=cap)
    expected = compute_baseline(frame, options=options, slice_spec=spec)
    # Every request goes to one random part (a request is never split); parts may be empty.
    part_of_request = rng.integers(0, parts, n_requests)
    part_of_row = part_of_request[frame["request_id"].str[1:].astype(int).to_numpy()]
    partials = []
    for p in rng.permutation(parts):
        rows = frame[part_of_row == p]  # may be empty
        partial = partial_of_frame(rows, options, spec.by)
        partials.append(partial.to_bytes() if through_bytes else partial)
    merged = merge_partials(partials)
    assert_same_result(merged.finish(inputs=("<frame>",), max_values_per_label=cap), expected)


def test_bytes_round_trip_is_exact_and_checked() -> None:
    frame = random_frame(np.random.default_rng(1), 30)
    partial = partial_baseline(validate_evaluation_frame(frame), MetricOptions(), ("segment",))
    again = PartialBaseline.from_bytes(partial.to_bytes())
    assert again.to_state() == partial.to_state() and again.overall == partial.overall
    with pytest.raises(ValueError, match="not a rankwatch-partial/1"):
        PartialBaseline.from_bytes(b"\x80")
    other = PartialBaseline.empty(MetricOptions(ndcg_cutoffs=(3,)), ("segment",))
    with pytest.raises(ValueError, match="different metric options"):
        other.merge(partial)
    with pytest.raises(ValueError, match="at least one"):
        merge_partials([])


def test_caps_are_applied_once_over_all_requests() -> None:
    """A value frequent overall but rare in every part is kept: caps cannot be applied per part."""
    rows = []
    for i in range(12):
        seg = "wide" if i % 3 == 0 else f"narrow-{i}"
        rows += [{"request_id": f"r{i}", "item_id": "a", "score": 1.0, "label": 1, "segment": seg}]
    import pandas as pd

    frame = pd.DataFrame(rows)
    spec = SliceSpec(by=("segment",), max_values_per_label=1)
    expected = compute_baseline(frame, slice_spec=spec)
    parts = [partial_baseline(validate_evaluation_frame(frame.iloc[i : i + 3]), MetricOptions(), ("segment",))
             for i in range(0, 12, 3)]  # fmt: skip
    got = merge_partials(parts).finish(inputs=("<frame>",), max_values_per_label=1)
    assert set(got.slices) == {(("segment", "wide"),), (("segment", "__other__"),)}
    assert got.label_overflow == expected.label_overflow == {"segment": 8}
    assert_same_result(got, expected)


def test_a_partition_of_invalid_rows_only_is_empty_or_named() -> None:
    frame = random_frame(np.random.default_rng(2), 5)
    frame["score"] = np.nan
    assert partial_of_frame(frame, MetricOptions(), skip_invalid=True).skipped_by_reason == {"bad_score": len(frame)}
    with pytest.raises(InvalidEvaluationData, match="<frame>: row 1: score is missing"):
        partial_of_frame(frame, MetricOptions())
