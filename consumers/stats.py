"""The service's health snapshot (:func:`service_health`), and adding up the streaming core's statistics of
several partition pairs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka.errors import KafkaError

from rankwatch.consumers.alignment import resume_offset
from rankwatch.pipeline.stream.processor import StreamStats


def merge_stats(parts: Sequence[StreamStats]) -> StreamStats:
    """Counters and gauges summed over ``parts``; the watermark is the minimum (the slowest pair).

    ``label_values`` is the maximum per label: each pair caps its labels on its own, so the sum would
    over-count values that several pairs share.
    """
    if not parts:
        raise ValueError("no statistics to merge")
    outcomes: dict[str, dict[str, int]] = {}
    rejects: dict[tuple[str, str], int] = {}
    label_values: dict[str, int] = {}
    label_overflow: dict[str, int] = {}
    windows: dict[str, int] = {}
    for s in parts:
        for stream, counts in s.outcomes.items():
            target = outcomes.setdefault(stream, {})
            for outcome, n in counts.items():
                target[outcome] = target.get(outcome, 0) + n
        for key, n in s.rejects.items():
            rejects[key] = rejects.get(key, 0) + n
        for label, n in s.label_values.items():
            label_values[label] = max(label_values.get(label, 0), n)
        for label, n in s.label_overflow.items():
            label_overflow[label] = label_overflow.get(label, 0) + n
        for w, n in s.windows_published.items():
            windows[w] = windows.get(w, 0) + n
    marks = [s.watermark_ms for s in parts]
    return StreamStats(
        outcomes=outcomes,
        rejects=rejects,
        pending_requests=sum(s.pending_requests for s in parts),
        pending_items=sum(s.pending_items for s in parts),
        pending_feedback=sum(s.pending_feedback for s in parts),
        watermark_ms=None if any(m is None for m in marks) else min(m for m in marks if m is not None),
        evicted_requests=sum(s.evicted_requests for s in parts),
        finalized_requests=sum(s.finalized_requests for s in parts),
        feedback_detached=sum(s.feedback_detached for s in parts),
        label_values=label_values,
        label_overflow=label_overflow,
        windows_published=windows,
        dedupe_ids=sum(s.dedupe_ids for s in parts),
        dedupe_forgotten_at_capacity=sum(s.dedupe_forgotten_at_capacity for s in parts),
    )


@dataclass(frozen=True)
class ServiceHealth:
    """What the exporter shows about the service at one moment.

    ``stats`` holds the streaming core's statistics per owned partition pair, ``merged`` their sum (the
    watermark is the minimum), ``lag`` the messages behind the high watermark per ``(topic, partition)``
    counted from the last record *fed* to the core.
    """

    stats: dict[int, StreamStats] = field(default_factory=dict)
    merged: StreamStats | None = None
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    checkpoints_written: int = 0
    checkpoint_failures: int = 0
    restores: int = 0
    windows_published: int = 0
    assigned: tuple[int, ...] = ()
    running: bool = False
    kafka_outage: bool = False
    kafka_outage_seconds: float = 0.0
    schema_registry_up: bool | None = None  # None: no Confluent-framed topic (consumers/decoding.py)
    schema_registry_outage_seconds: float = 0.0
    restoring: tuple[int, ...] = ()


def consumer_lag(pairs: Iterable[Any], highwater: Callable[[Any], int | None]) -> dict[tuple[str, int], int]:
    """Records behind the high watermark per ``(topic, partition)`` of the pairs'
    (:class:`consumers.alignment.PartitionPair`) topic-partitions, counted from the last record *fed* to
    the core (records waiting in the alignment buffers are lag); a partition whose high watermark is
    not known yet (``highwater`` gives None) is left out."""
    lag: dict[tuple[str, int], int] = {}
    for pair in pairs:
        for tp in pair.buffers:
            hw = highwater(tp)
            if hw is None:
                continue
            fed = resume_offset(pair, tp)
            lag[(tp.topic, tp.partition)] = max(0, hw - (0 if fed is None else fed))
    return lag


def service_health(svc: Any, *, running: bool) -> ServiceHealth:
    """The health of ``svc`` (a :class:`consumers.service.ConsumerService`) now: its pairs' statistics and
    their sum, the lag, the checkpoint, dead-letter, outage and restore counters."""

    def highwater(tp: Any) -> int | None:
        try:
            return svc._consumer.highwater(tp) if svc._consumer is not None else None
        except KafkaError:
            return None

    with svc._lock:
        stats = {p: pair.processor.stats() for p, pair in svc._pairs.items()}
        lag = consumer_lag(svc._pairs.values(), highwater)
        assigned = tuple(sorted(svc._pairs))
        restoring = tuple(sorted(svc._rebalancer.restoring))
    gate = svc._gate
    return ServiceHealth(
        stats=stats, merged=merge_stats(list(stats.values())) if stats else None, lag=lag,
        dead_letters=dict(svc._dead.counts) if svc._dead else {}, checkpoints_written=svc.committer.written,
        checkpoint_failures=svc.committer.failures, restores=svc._restores,
        windows_published=svc._published, assigned=assigned, running=running,
        kafka_outage=svc._outage.active, kafka_outage_seconds=svc._outage.seconds_total(),
        schema_registry_up=None if gate is None else not gate.outage.active,
        schema_registry_outage_seconds=0.0 if gate is None else gate.outage.seconds_total(),
        restoring=restoring,
    )
