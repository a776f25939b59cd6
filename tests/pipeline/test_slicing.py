"""Slice specs, label caps and Prometheus label sets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.pipeline.slicing import OVERFLOW_VALUE, LabelCapper, SliceSpec, prometheus_labels


def test_spec_defaults_and_canonical_order() -> None:
    assert SliceSpec().by == ("segment", "surface")
    assert SliceSpec(by=("model", "segment", "variant")).by == ("segment", "variant", "model")
    assert SliceSpec(by=("surface", "segment")).key({"segment": "a"}) == (("segment", "a"), ("surface", "unknown"))
    assert SliceSpec(by=()).key({"segment": "a"}) == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"by": ("colour",)}, "colour"), ({"by": ("segment", "segment")}, "repeat"), ({"max_values_per_label": 0}, ">= 1")],
)
def test_spec_rejects_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SliceSpec(**kwargs)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.sampled_from("abcdefgh"), max_size=60), cap=st.integers(1, 5))
def test_capper_keeps_first_values_and_counts_overflow(values: list[str], cap: int) -> None:
    capper = LabelCapper(cap)
    out = [capper.cap("segment", v) for v in values]
    first_seen = list(dict.fromkeys(values))[:cap]
    assert out == [v if v in first_seen else OVERFLOW_VALUE for v in values]
    assert capper.overflow.get("segment", 0) == sum(1 for v in values if v not in first_seen)
    assert capper.distinct("segment") == len(first_seen)
    back = LabelCapper.from_state(capper.to_state())
    assert [back.cap("segment", v) for v in values] == out


def test_prometheus_labels_use_all_for_labels_not_split_on() -> None:
    assert prometheus_labels(()) == {"segment": "all", "surface": "all", "variant": "all"}
    key = (("segment", "new_user"), ("model", "m1"))
    assert prometheus_labels(key) == {"segment": "new_user", "surface": "all", "variant": "all"}
