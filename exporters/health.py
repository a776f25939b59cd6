"""Health figures of the pipeline, read off the streaming core's statistics.

The exporter keeps its own plain copy (:class:`HealthFigures`) so that a scrape never touches the live
stream processor: the owner of the processor calls :meth:`exporters.state.MetricsState.set_stream_stats`
with a fresh ``StreamStats`` (under its own lock), and this module copies out the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwatch.pipeline.stream.processor import OUTCOMES, STREAMS, StreamStats


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


def health_from_stats(
    stats: StreamStats, *, pending_requests_limit: int | None = None, label_values_limit: int | None = None
) -> HealthFigures:
    """Copy the numbers of a :class:`pipeline.stream.processor.StreamStats`.

    Every (stream, outcome) pair is present, zeros included, so ``rate()`` works from the first scrape.
    """
    events = {(stream, outcome): 0 for stream in STREAMS for outcome in OUTCOMES}
    for stream, counts in stats.outcomes.items():
        for outcome, n in counts.items():
            events[(str(stream), str(outcome))] = int(n)
    return HealthFigures(
        events=events,
        rejects={(str(stream), _code(reason)): int(n) for (stream, reason), n in stats.rejects.items()},
        pending_requests=int(stats.pending_requests),
        pending_items=int(stats.pending_items),
        pending_requests_limit=pending_requests_limit,
        evicted_requests=int(stats.evicted_requests),
        watermark_ms=None if stats.watermark_ms is None else int(stats.watermark_ms),
        label_values={str(k): int(v) for k, v in stats.label_values.items()},
        label_overflow={str(k): int(v) for k, v in stats.label_overflow.items()},
        label_values_limit=label_values_limit,
    )


def _code(reason: Any) -> str:
    """Enum members expose their ``value`` (the stable reason code); anything else its ``str``."""
    return str(getattr(reason, "value", reason))
