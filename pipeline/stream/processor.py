"""The streaming core: validated events in, published event-time windows out (SPEC sections 1 to 3).

:class:`StreamProcessor` wires :mod:`pipeline.events.validation` (decoding), :mod:`pipeline.stream.join` (pending
requests), :mod:`pipeline.stream.memory` (dedupe, finalized ids, early feedback), :mod:`pipeline.stream.watermark` and
:mod:`pipeline.stream.windows`. It is single-threaded and pure: time comes from event timestamps and, only in
:meth:`StreamProcessor.tick`, from the injected clock. docs/streaming.md explains every decision.

Event outcomes (``stats().outcomes[stream][outcome]``), each event counted exactly once:

- ``rejected``: bad input (reason in ``stats().rejects``), sent to the dead-letter sink;
- ``duplicate``: an ``event_id`` already seen (within the dedupe memory);
- ``late``: an impression whose request's deadline the stepped watermark already passed, or feedback that
  came after its request was finalized or lies outside its attribution window;
- ``orphan``: feedback whose request was never seen by the time no impression could still claim it;
- ``accepted``: everything else (feedback: once it is attributed).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from rankwatch.pipeline.clock import Clock, datetime_to_ms
from rankwatch.pipeline.events.deadletter import DeadLetter, DeadLetterSink
from rankwatch.pipeline.events.records import Feedback, Impression, SourceRef
from rankwatch.pipeline.events.validation import (
    Rejection,
    RejectReason,
    feedback_or_rejection,
    impression_or_rejection,
)
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import LabelCapper, SliceKey
from rankwatch.pipeline.stream.batch import process_batch
from rankwatch.pipeline.stream.config import OUTCOMES, STREAMS, StreamConfig, StreamStats
from rankwatch.pipeline.stream.durations import parse_duration_ms
from rankwatch.pipeline.stream.experiments import StreamExperiments
from rankwatch.pipeline.stream.join import FinalizedBatch, PendingRequests, feedback_entry
from rankwatch.pipeline.stream.mapped import Translated, process_mapped_batch
from rankwatch.pipeline.stream.memory import EarlyFeedback, ExpiringIds
from rankwatch.pipeline.stream.prepare import BatchSpec, PreparedRows
from rankwatch.pipeline.stream.processor_state import load_state, state_of
from rankwatch.pipeline.stream.snapshot import decode_snapshot, encode_snapshot
from rankwatch.pipeline.stream.staging import ListStaging
from rankwatch.pipeline.stream.watermark import Watermark
from rankwatch.pipeline.stream.windows import BatchParts, WindowsElsewhere, WindowSet


class StreamProcessor:
    """Decode, validate, dedupe, join, window and publish (see module docstring)."""

    def __init__(
        self,
        config: StreamConfig,
        *,
        clock: Clock,
        dead_letters: DeadLetterSink | None = None,
        partitions: tuple[int, ...] = (),
        translator: Any = None,
    ) -> None:
        self.config = config
        # a pipeline.events.translate.Translator makes process_batch read a team's own schema
        # (pipeline/stream/mapped.py); None (the identity mapping) reads section 1 events as ever.
        self.translator = translator
        self.clock = clock
        self.dead_letters = dead_letters
        self.partitions = tuple(partitions)
        cfg = config
        self._attr = cfg.attribution_window_ms
        self._step = cfg.finalize_step_ms
        self._grades = dict(cfg.action_grades)
        self.batch_spec = BatchSpec.of(cfg)  # what the batch path's stateless rows depend on
        self._pending = PendingRequests(
            attribution_window_ms=cfg.attribution_window_ms, step_ms=cfg.finalize_step_ms,
            max_items_per_request=cfg.max_items_per_request,
        )
        self._early = EarlyFeedback(
            attribution_window_ms=cfg.attribution_window_ms, step_ms=cfg.finalize_step_ms,
            capacity=cfg.max_pending_feedback,
        )
        self._seen = ExpiringIds(
            capacity=cfg.dedupe_capacity,
            retention_ms=cfg.attribution_window_ms + cfg.allowed_disorder_ms + cfg.finalize_step_ms,
        )
        self._finalized = ExpiringIds(capacity=cfg.finalized_memory, retention_ms=cfg.attribution_window_ms)
        self._watermark = Watermark(
            partitions=self.partitions, allowed_disorder_ms=cfg.allowed_disorder_ms, idle_timeout_ms=cfg.idle_timeout_ms
        )
        self._wm_step: int | None = None  # the stepped watermark everything is decided against
        # Without partitions, an event at or below the largest ts seen since the last tick cannot change
        # the watermark (its partition is already marked active): such events skip Watermark.observe.
        self._skip_observe_upto = -1
        self._windows = WindowSet(cfg.windows, cfg.metric_options)
        self._staging = ListStaging(
            group_ms=math.gcd(*self._windows.sizes_ms), attribution_window_ms=cfg.attribution_window_ms
        )
        self._capper = LabelCapper(cfg.slice_spec.max_values_per_label)
        self._by = cfg.slice_spec.by
        # The raw slice-label values of an impression as a tuple, in one C call.
        self._labels_of: Callable[[Impression], tuple[str, ...]] = (
            operator.attrgetter(*self._by) if len(self._by) > 1
            else (lambda imp: tuple(getattr(imp, lbl) for lbl in self._by))
        )
        self._combo_ids: dict[tuple[str, ...], int] = {}
        self._combo_keys: list[SliceKey] = []
        self._combo_cache: dict[tuple[str, ...], int] = {}  # raw values that needed no folding -> combo
        self._wire_combo: dict[tuple[str | None, ...], int] = {}  # the same, keyed by wire labels (batch path)
        self._imp = dict.fromkeys(OUTCOMES, 0)
        self._clk = dict.fromkeys(OUTCOMES, 0)
        self._rejects: dict[tuple[str, str], int] = {}
        self._evicted = 0
        self._finalized_count = 0
        self._detached = 0
        self._experiments = StreamExperiments(cfg.experiments, cfg.metric_options, slice_by=cfg.slice_spec.by,
                                              smallest_window=min(cfg.windows, key=parse_duration_ms))
        # Where the aggregation half goes (see offload_windows): None, here.
        self._windows_elsewhere: WindowsElsewhere | None = None

    # -- public API ------------------------------------------------------------------------------------
    def process_impression(self, raw: bytes, *, source: SourceRef | None = None) -> list[PublishedWindow]:
        cfg = self.config
        imp = impression_or_rejection(raw, cfg.max_event_bytes, cfg.max_items_per_request)
        if type(imp) is not Impression:
            self._reject("impressions", raw, imp, source)  # type: ignore[arg-type]
            return []
        out = self._first_sighting(imp.event_id, imp.ts_ms, source, self._imp)
        if out is None:
            return []
        rid = imp.request_id
        ws = self._wm_step
        if (ws is not None and imp.ts_ms + self._attr < ws) or rid in self._finalized.ids:
            self._imp["late"] += 1
            return out
        pending = self._pending
        slot = pending.index.get(rid)
        if slot is None:
            if len(pending.index) >= cfg.max_pending_requests:
                out.extend(self._evict())
            slot = pending.add(imp, self._combo(imp))
            if self._early.count and rid in self._early.by_request:
                for entry in self._early.pop(rid):
                    self._attach(slot, entry)
        else:
            problem = pending.extend(slot, imp)
            if problem is not None:
                self._reject("impressions", raw, problem, source)
                return out
        self._imp["accepted"] += 1
        return out

    def process_batch(
        self, kinds: Sequence[bool], values: Sequence[bytes], *, partition: int | None = None,
        offsets: Sequence[int] | None = None, topics: tuple[str, str] = ("impressions", "clicks"),
        source_of: Callable[[int], SourceRef] | None = None, rows: PreparedRows | None = None,
        translated: Translated | None = None,
    ) -> list[PublishedWindow]:
        """Process a poll's records at once (``kinds[i]``: impression?); equal to the per-record calls.

        With a :attr:`translator` the values are in the team's schema (:mod:`pipeline.stream.mapped`); the
        per-record methods always take section 1 events. See :mod:`pipeline.stream.batch`: the source of
        record ``i`` is ``(topics[kind], partition, offsets[i])``, or ``source_of(i)`` when given, built only
        for a dead letter. Made elsewhere already (``rankwatch replay``'s log reader makes them): ``rows``,
        the stateless rows of the first section 1 events (:mod:`pipeline.stream.prepare`), and with a
        translator ``translated``, what the values map to.
        """
        if self.translator is not None:
            return process_mapped_batch(self, self.translator, kinds, values, partition=partition, offsets=offsets,
                                        topics=topics, source_of=source_of, translated=translated, rows=rows)
        if translated is not None:
            raise ValueError("translated events, but this processor reads section 1 events")
        return process_batch(self, kinds, values, partition=partition, offsets=offsets, topics=topics,
                             source_of=source_of, rows=rows)

    def _first_sighting(
        self, eid: str, ts_ms: int, source: SourceRef | None, counts: dict[str, int]
    ) -> list[PublishedWindow] | None:
        """None for a duplicate event id (counted); else remember the id and return what its time closes."""
        seen = self._seen
        if eid in seen.ids:
            counts["duplicate"] += 1
            return None
        out = [] if ts_ms <= self._skip_observe_upto else self._observe(source, ts_ms)
        tag = self._wm_step or 0
        if tag == seen.tail_tag and len(seen.ids) < seen.capacity:  # ExpiringIds.add's common case, inlined
            seen.ids.add(eid)
            seen.tail.append(eid)
        else:
            seen.add(eid, tag)
        return out

    def process_feedback(self, raw: bytes, *, source: SourceRef | None = None) -> list[PublishedWindow]:
        fb = feedback_or_rejection(raw, self._grades, self.config.max_event_bytes)
        if type(fb) is not Feedback:
            self._reject("clicks", raw, fb, source)  # type: ignore[arg-type]
            return []
        out = self._first_sighting(fb.event_id, fb.ts_ms, source, self._clk)
        if out is None:
            return []
        pending = self._pending
        slot = pending.index.get(fb.request_id)
        if slot is not None:  # the common case, inlined: see _attach
            rts = pending.ts[slot]
            fts = fb.ts_ms
            if fts > rts + self._attr:
                self._clk["late"] += 1
            else:
                counted = fts >= rts
                if counted:
                    self._clk["accepted"] += 1
                entry = (fb.item_id, fb.grade, fts, counted)
                held = pending.feedback[slot]
                pending.feedback[slot] = (entry,) if held is None else (*held, entry)
        elif fb.request_id in self._finalized.ids:
            self._clk["late"] += 1
        elif self._wm_step is not None and fb.ts_ms + self._attr < self._wm_step:
            self._clk["orphan"] += 1  # no impression that is not late could still claim it
        else:
            if self._early.count >= self.config.max_pending_feedback:
                self._clk["orphan"] += self._early.evict_oldest()
            self._early.add(fb.request_id, feedback_entry(fb, False))
        return out

    def tick(self) -> list[PublishedWindow]:
        """Idle handling: let the clock move the watermark of partitions without traffic."""
        wm = self._watermark.tick(datetime_to_ms(self.clock.now()))
        self._skip_observe_upto = -1  # the tick forgot which partitions were active
        return self._maybe_advance(wm)

    def flush(self) -> list[PublishedWindow]:
        """End of input: finalize every pending request, orphan waiting feedback, publish every window."""
        pending, staging, step = self._pending, self._staging, self._step
        while (b := pending.next_bucket()) is not None:
            self._finalize_bucket(evicted=False)
            # A group is complete once the buckets of all its requests' deadlines are finalized: aggregated now,
            # in the key order the end would take them (the same calls), so that a worker elsewhere
            # (offload_windows) aggregates it while the rest is finalized here, not after.
            for staged in staging.complete((b + 1) * step):
                self._aggregate(staged)
        self._clk["orphan"] += self._early.expire(2**62)
        for staged in staging.complete(None):
            self._aggregate(staged)
        return self._close(None)

    @property
    def watermark_step(self) -> int | None:
        """The stepped watermark every decision is made against (None before the first event's time): requests
        whose deadline bucket ends by it are finalized."""
        return self._wm_step

    def stats(self) -> StreamStats:
        return StreamStats(
            outcomes={"impressions": dict(self._imp), "clicks": dict(self._clk)},
            rejects=dict(self._rejects),
            pending_requests=len(self._pending),
            pending_items=self._pending.n_items,
            pending_feedback=len(self._early),
            watermark_ms=self._watermark.value,
            evicted_requests=self._evicted,
            finalized_requests=self._finalized_count,
            feedback_detached=self._detached,
            label_values={lbl: self._capper.distinct(lbl) for lbl in self._by},
            label_overflow={lbl: self._capper.overflow.get(lbl, 0) for lbl in self._by},
            windows_published=dict(self._windows.published if self._windows_elsewhere is None
                                    else self._windows_elsewhere.published),
            dedupe_ids=len(self._seen),
            dedupe_forgotten_at_capacity=self._seen.forgotten_at_capacity,
            experiments=self._experiments.sums(),
        )

    def offload_windows(self, elsewhere: WindowsElsewhere) -> None:
        """Hand the aggregation half to ``elsewhere`` from now on: each staged batch of finalized requests
        (:meth:`WindowsElsewhere.aggregate`) and each window close (:meth:`WindowsElsewhere.close`), in the order
        this processor would have run them, which :meth:`apply_offloaded` runs on a copy of this processor (made
        before anything was processed), so its windows come out the same. Windows are then published there, not
        returned here; ``stats().windows_published`` asks ``elsewhere``; a snapshot is refused. Only without
        experiments (their sums ride in this processor's stats). ``rankwatch replay`` uses it to run the kernel,
        the windows and the result document in another process (rankwatch/commands/window_worker.py)."""
        if self._experiments.any:
            raise ValueError("the windows of a processor with experiments stay in it")
        self._windows_elsewhere = elsewhere

    def count_only_windows(self, labels: Sequence[str]) -> None:
        """Before any event: windows of the sizes ``labels`` are counted in ``stats().windows_published`` but not
        summed, and not returned when published (their kernel parts are not added: for a caller that reads only
        the other sizes, as ``rankwatch replay`` reads only the largest without ``--windows-out``). Not with
        experiments (request-unit ones read the smallest size's windows); a snapshot is refused."""
        if self._experiments.any:
            raise ValueError("experiments read the windows: every size is summed")
        if self._windows.open:
            raise ValueError("windows are open already: count_only_windows comes before any event")
        unknown = set(labels) - set(self._windows.labels)
        if unknown:
            raise ValueError(f"no such window size: {', '.join(sorted(unknown))}")
        self._windows.counted_only = frozenset(i for i, lbl in enumerate(self._windows.labels) if lbl in labels)

    def apply_offloaded(self, op: tuple[Any, ...], made: BatchParts | None = None) -> list[PublishedWindow]:
        """Run one operation an offloading processor handed on (:meth:`offload_windows`); returns what a close
        published. ``made``: :meth:`offloaded_parts` of an ``aggregate`` operation, when made ahead."""
        if op[0] == "aggregate":
            _, batch, new_keys = op
            self._combo_keys.extend(new_keys)
            self._aggregate(batch, made)
            return []
        _, horizon, partitions = op
        return self._publish_due(horizon, partitions)

    def experiment_data(self, name: str) -> Any:
        """The :class:`pipeline.experiments.data.ExperimentData` of experiment ``name`` as this processor holds it."""
        return self._experiments.data(name)

    # -- internals -------------------------------------------------------------------------------------
    def reject(self, stream: str, raw: bytes, reason: RejectReason | str, detail: str,
               source: SourceRef | None = None) -> None:
        """Count and dead-letter an event found bad before the core saw it, exactly like the core's own
        rejections (``stream`` is ``"impressions"`` or ``"clicks"``; ``raw`` the bytes as received).

        Used where a team's events are translated first (:mod:`pipeline.events.mapping`): an event that
        cannot be decoded or mapped is bad input like any other, with its original bytes kept.
        """
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        self._reject(stream, raw, Rejection(RejectReason(reason), detail), source)

    def _reject(self, stream: str, raw: bytes, rejection: Rejection, source: SourceRef | None) -> None:
        (self._imp if stream == "impressions" else self._clk)["rejected"] += 1
        key = (stream, str(rejection.reason))
        self._rejects[key] = self._rejects.get(key, 0) + 1
        if self.dead_letters is not None:
            self.dead_letters.send(DeadLetter(stream, raw, rejection.reason, rejection.detail, source))

    def _combo(self, imp: Impression) -> int:
        return self._combo_raw(self._labels_of(imp))

    def _combo_raw(self, raw: tuple[str, ...]) -> int:
        """The combo id of raw slice-label values (folding values past the cap into ``__other__``)."""
        combo = self._combo_cache.get(raw)
        if combo is not None:
            return combo
        capped = tuple(self._capper.cap(lbl, v) for lbl, v in zip(self._by, raw, strict=True))
        combo = self._combo_ids.get(capped)
        if combo is None:
            combo = self._combo_ids[capped] = len(self._combo_keys)
            self._combo_keys.append(tuple(zip(self._by, capped, strict=True)))
        if capped == raw:
            self._combo_cache[raw] = combo
        return combo

    def _attach(self, slot: int, entry: tuple[str, int, int, bool]) -> None:
        """Feedback for a pending request: accepted if inside its window, late if after, undecided if before."""
        rts = self._pending.ts[slot]
        fts = entry[2]
        if fts > rts + self._attr:
            self._clk["late"] += 1  # request_ts can only move earlier, so this stays outside
            return
        counted = fts >= rts
        if counted:
            self._clk["accepted"] += 1
        self._pending.add_feedback(slot, (entry[0], entry[1], fts, counted))

    def _observe(self, source: SourceRef | None, ts_ms: int) -> list[PublishedWindow]:
        return self._observe_at(None if source is None else source.partition, ts_ms)

    def _observe_at(self, partition: int | None, ts_ms: int) -> list[PublishedWindow]:
        watermark = self._watermark
        wm = watermark.observe(partition, ts_ms)
        if not watermark.partitioned:
            self._skip_observe_upto = watermark.max_ts[-1]  # type: ignore[assignment]
        if wm is None or (self._wm_step is not None and wm < self._wm_step + self._step):
            return []  # still inside the current step: nothing to decide
        return self._maybe_advance(wm)

    def _maybe_advance(self, wm: int | None) -> list[PublishedWindow]:
        if wm is None:
            return []
        ws = wm // self._step * self._step
        if self._wm_step is not None and ws <= self._wm_step:
            return []
        self._wm_step = ws
        pending, step = self._pending, self._step
        while (b := pending.next_bucket()) is not None and (b + 1) * step <= ws:
            self._finalize_bucket(evicted=False)
        self._clk["orphan"] += self._early.expire(ws)
        self._seen.expire(ws)
        self._finalized.expire(ws)
        for staged in self._staging.complete(ws):
            self._aggregate(staged)
        horizon = ws - self._attr
        windows = self._windows
        if self._windows_elsewhere is None and (
                not windows.open or horizon < min(start + windows.sizes_ms[i] for i, start in windows.open)):
            return []  # no open window ends by the horizon: close would publish nothing
        return self._close(horizon)

    def _close(self, horizon: int | None) -> list[PublishedWindow]:
        """Publish the windows that end by ``horizon`` (all when None), here or elsewhere."""
        if self._windows_elsewhere is not None:
            self._windows_elsewhere.close(horizon, self.partitions)
            return []
        return self._publish_due(horizon, self.partitions)

    def _publish_due(self, horizon: int | None, partitions: tuple[int, ...]) -> list[PublishedWindow]:
        return self._experiments.windows(self._windows.close(horizon, self._combo_keys, partitions))

    def _evict(self) -> list[PublishedWindow]:
        """At the pending cap: finalize the earliest bucket now (counted as evicted)."""
        while len(self._pending) >= self.config.max_pending_requests and self._pending.next_bucket() is not None:
            self._finalize_bucket(evicted=True)
        return []

    def _finalize_bucket(self, *, evicted: bool) -> None:
        slots = self._pending.take_bucket()
        if not slots:
            return
        batch = self._pending.finalize_lists(slots)
        self._clk["accepted"] += batch.feedback_accepted
        self._clk["late"] += batch.feedback_late
        self._detached += batch.feedback_detached
        self._finalized_count += batch.n_requests
        if evicted:
            self._evicted += batch.n_requests
        tag = self._wm_step or 0
        self._finalized.add_many(batch.request_ids, tag)
        for staged in self._staging.add(batch):
            self._aggregate(staged)

    def offloaded_parts(self, op: tuple[Any, ...]) -> BatchParts:
        """The kernel's parts of an ``aggregate`` operation (:meth:`WindowSet.kernel`): stateless, so they can be
        made ahead of :meth:`apply_offloaded`, several at once."""
        return self._windows.kernel(op[1])

    def _aggregate(self, batch: FinalizedBatch, made: BatchParts | None = None) -> None:
        """One kernel call for the batch (unless ``made``), its parts into the windows (:meth:`WindowSet.add_parts`),
        or elsewhere."""
        if self._windows_elsewhere is not None:
            self._windows_elsewhere.aggregate(batch, self._combo_keys)
            return
        metrics = self._windows.add_parts(self._windows.kernel(batch) if made is None else made, self._combo_keys)
        self._experiments.fold(batch, metrics, self._combo_keys)

    # -- snapshot --------------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole state as msgpack bytes; :meth:`restore` gives a processor that behaves identically."""
        if self._windows_elsewhere is not None:
            raise ValueError("the windows of this processor are elsewhere (offload_windows): no snapshot")
        return encode_snapshot(self.config.fingerprint(), state_of(self))

    @classmethod
    def restore(
        cls, data: bytes, *, config: StreamConfig, clock: Clock, dead_letters: DeadLetterSink | None = None,
        translator: Any = None,
    ) -> StreamProcessor:
        state = decode_snapshot(data, config.fingerprint())
        partitions = tuple(p for p in state["watermark"]["partitions"] if p != -1)
        out = cls(config, clock=clock, dead_letters=dead_letters, partitions=partitions, translator=translator)
        load_state(out, state)
        return out


__all__ = ["StreamConfig", "StreamProcessor", "WindowsElsewhere", "StreamStats", "RejectReason", "STREAMS", "OUTCOMES"]
