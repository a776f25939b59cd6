"""Health figures of the pipeline, read off the streaming core's statistics.

The exporter keeps its own plain copy (:class:`HealthFigures`) so that a scrape never touches the live
stream processor: the owner of the processor calls :meth:`exporters.state.MetricsState.set_stream_stats`
with a fresh ``StreamStats`` (under its own lock), and this module copies out the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HealthFigures:
    """Counters and gauges of the streaming core at one moment."""

    events: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (stream, outcome) -> count
    rejects: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (stream, reason) -> count
    pending_requests: int = 0
    pending_items: int = 0
    pending_requests_limit: int | None = None
    evicted_requests: int = 0
    watermark_ms: int | None = None
    label_values: Mapping[str, int] = field(default_factory=dict)
    label_overflow: Mapping[str, int] = field(default_factory=dict)
    label_values_limit: int | None = None


def _pairs(mapping: Any) -> dict[tuple[str, str], int]:
    """``{(a, b): n}`` from either a flat pair-keyed mapping or a nested ``{a: {b: n}}`` mapping."""
    out: dict[tuple[str, str], int] = {}
    for key, value in dict(mapping or {}).items():
        if isinstance(value, Mapping):
            for inner, n in value.items():
                out[(str(key), _name(inner))] = int(n)
        else:
            a, b = key
            out[(str(a), _name(b))] = int(value)
    return out


def _name(value: Any) -> str:
    """Enum members expose their ``value`` (the stable reason code); anything else its ``str``."""
    inner = getattr(value, "value", value)
    return str(inner)


def health_from_stats(
    stats: Any, *, pending_requests_limit: int | None = None, label_values_limit: int | None = None
) -> HealthFigures:
    """Copy the numbers of a ``pipeline.stream.StreamStats`` into :class:`HealthFigures`."""
    outcomes = getattr(stats, "outcomes", None)
    if outcomes is None:
        outcomes = getattr(stats, "events", {})
    overflow = getattr(stats, "label_overflow", None) or {}
    values = getattr(stats, "label_values", None) or {}
    return HealthFigures(
        events=_pairs(outcomes),
        rejects=_pairs(getattr(stats, "rejects", {})),
        pending_requests=int(getattr(stats, "pending_requests", 0)),
        pending_items=int(getattr(stats, "pending_items", 0)),
        pending_requests_limit=pending_requests_limit,
        evicted_requests=int(getattr(stats, "evicted_requests", 0)),
        watermark_ms=getattr(stats, "watermark_ms", None),
        label_values={str(k): int(v) for k, v in dict(values).items()},
        label_overflow={str(k): int(v) for k, v in dict(overflow).items()},
        label_values_limit=label_values_limit,
    )
