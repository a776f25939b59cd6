"""Event types: plain, immutable values; both impression forms share one type."""

from __future__ import annotations

import pytest

from rankwatch.pipeline.events.records import Feedback, Impression, SourceRef


def test_source_ref_is_a_tuple():
    ref = SourceRef("impressions", 2, 41)
    assert ref == ("impressions", 2, 41) and ref.partition == 2


def test_events_are_frozen_with_defaults():
    imp = Impression("e", "r", 1, ("a",), (1,), (0.5,))
    assert (imp.segment, imp.surface, imp.variant, imp.model, imp.item_form) == ("unknown",) * 4 + (False,)
    assert imp.label("segment") == "unknown"
    with pytest.raises(AttributeError):
        imp.ts_ms = 2  # type: ignore[misc]
    fb = Feedback("c", "r", "a", 5, 3, "purchase")
    assert fb.grade == 3 and not hasattr(fb, "__dict__")  # slots: no per-event dict
