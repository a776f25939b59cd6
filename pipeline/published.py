"""A published window: what the streaming core hands to exporters and ``--windows-out``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.result import result_document
from rankwatch.pipeline.slicing import SliceKey


@dataclass(frozen=True)
class PublishedWindow:
    """One closed event-time window.

    Identity is ``(window, start, partitions)``: a reader that sees the same identity twice is looking at a
    republication (e.g. after a restart), not a new value; ``revision`` grows if the content ever changes.
    """

    window: str  # size label, e.g. "5m", "1h"
    start: datetime  # aware UTC, aligned to the epoch
    end: datetime
    overall: RankingAggregate
    slices: dict[SliceKey, RankingAggregate]
    partitions: tuple[int, ...] = ()  # source partitions whose requests it covers; () when unpartitioned
    revision: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, datetime, tuple[int, ...]]:
        return (self.window, self.start, self.partitions)

    def document(self) -> dict[str, Any]:
        """The result document plus ``window``, ``start``, ``end`` (RFC 3339 UTC) and the identity."""
        doc = result_document(self.overall, self.slices)
        doc.update(
            window=self.window,
            start=_rfc3339(self.start),
            end=_rfc3339(self.end),
            partitions=list(self.partitions),
            revision=self.revision,
        )
        return doc


def _rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
