"""The streaming core's settings and statistics: :class:`StreamConfig` (validated at construction, with the
fingerprint a snapshot's meaning depends on) and :class:`StreamStats` (what ``StreamProcessor.stats()``
reports). Re-exported by :mod:`pipeline.stream.processor`; kept apart so the processor module holds processing only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rankwatch.pipeline.events.validation import DEFAULT_ACTION_GRADES
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.durations import parse_duration_ms

STREAMS = ("impressions", "clicks")
OUTCOMES = ("accepted", "duplicate", "rejected", "orphan", "late")


@dataclass(frozen=True)
class StreamConfig:
    """Settings of the streaming core (all times in event-time milliseconds unless said otherwise)."""

    windows: tuple[str, ...] = ("5m", "1h")
    attribution_window_ms: int = 30 * 60 * 1000
    allowed_disorder_ms: int = 60_000
    idle_timeout_ms: int = 120_000  # clock time without events before a partition stops holding the watermark
    max_pending_requests: int = 1_000_000
    max_items_per_request: int = 200
    max_event_bytes: int = 1_000_000
    dedupe_capacity: int = 5_000_000
    action_grades: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict(DEFAULT_ACTION_GRADES)))
    metric_options: MetricOptions = MetricOptions()
    slice_spec: SliceSpec = SliceSpec()
    # Additions beyond the first API sketch:
    finalize_step_ms: int = 1_000  # finalization granularity: requests are finalized in buckets of this size
    max_pending_feedback: int = 1_000_000  # feedback events waiting for their impression
    finalized_memory: int = 1_000_000  # finalized request ids remembered to tell late feedback from orphans
    # Experiments whose cumulative state rides in this processor's snapshot (docs/experiments.md, "Online").
    experiments: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        for w in self.windows:
            parse_duration_ms(w)
        positive = ("attribution_window_ms", "max_pending_requests", "max_items_per_request", "max_event_bytes",
                    "dedupe_capacity", "finalize_step_ms", "max_pending_feedback", "finalized_memory", "idle_timeout_ms")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_items_per_request > 65_535:
            raise ValueError("max_items_per_request must be <= 65535")
        if self.allowed_disorder_ms < 0:
            raise ValueError("allowed_disorder_ms must be >= 0")
        if not self.windows:
            raise ValueError("at least one window size is needed")

    def fingerprint(self) -> dict[str, Any]:
        """Settings a snapshot's meaning depends on."""
        return {
            "windows": list(self.windows),
            "attribution_window_ms": self.attribution_window_ms,
            "finalize_step_ms": self.finalize_step_ms,
            "slice_by": list(self.slice_spec.by),
            "metric_options": self.metric_options.to_dict(),
        }


@dataclass
class StreamStats:
    """Counters and gauges of a processor (all counters are cumulative since the first event)."""

    outcomes: dict[str, dict[str, int]]
    rejects: dict[tuple[str, str], int]
    pending_requests: int
    pending_items: int
    pending_feedback: int
    watermark_ms: int | None
    evicted_requests: int
    finalized_requests: int
    feedback_detached: int
    label_values: dict[str, int]
    label_overflow: dict[str, int]
    windows_published: dict[str, int]
    dedupe_ids: int
    dedupe_forgotten_at_capacity: int
    experiments: dict[str, Any] = field(default_factory=dict)  # name -> abonline.ExperimentSums
