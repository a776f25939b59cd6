"""Drift: online minus offline on the intersection, one-sided slices reported (property test, naive oracle)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.exporters.series import SeriesValues, drift

LABELS = st.tuples(
    st.sampled_from(["a", "b", "all"]), st.sampled_from(["x", "all"]), st.sampled_from(["c", "all"])
)
METRICS = ("mrr", "ndcg@10", "auc_roc")
VALUE = st.one_of(st.none(), st.floats(0, 1))
SERIES = st.builds(
    SeriesValues,
    requests=st.integers(0, 100),
    metrics=st.fixed_dictionaries({m: VALUE for m in METRICS}),
)


@settings(max_examples=60, deadline=None)
@given(
    online=st.dictionaries(LABELS, SERIES, max_size=8),
    offline=st.dictionaries(LABELS, SERIES, max_size=8),
    data=st.data(),
)
def test_drift_matches_a_naive_oracle(online, offline, data) -> None:
    primary = frozenset(data.draw(st.sets(st.sampled_from(sorted(online)))) if online else set())
    result = drift(online, primary, offline)
    expected = {}
    for labels in online:
        if labels in offline:
            for m in METRICS:
                a, b = online[labels].metrics[m], offline[labels].metrics[m]
                if a is not None and b is not None:
                    expected[(labels, m)] = a - b
    assert result.values == expected
    assert set(result.online_only) == {lbl for lbl in primary if lbl not in offline}
    assert set(result.offline_only) == {lbl for lbl in offline if lbl not in online}
    # Nothing is invented: every drift key exists on both sides.
    assert all(lbl in online and lbl in offline for lbl, _ in result.values)
