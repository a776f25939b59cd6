"""A poll's records in a team's own schema through the native core: translate, then :func:`process_batch`.

Layout: :func:`process_mapped_batch` translates the poll's records with a
:class:`~pipeline.events.translate.Translator` (:meth:`~pipeline.events.translate.Translator.translate_kinds`,
all first: translation reads no state), hands the section 1 events to the native batch path (in one call
when every record maps to one event, the usual poll; else in runs), and rejects what cannot be read through
:meth:`StreamProcessor.reject` at its place in the sequence;
:class:`OriginalBytes` is the dead-letter sink wrapper that puts each message's *original* bytes (not the
translated ones) into the dead letters the core writes for it.

Why it is exact: a rejection changes counts and dead letters only (never the watermark or any state), and
the runs between rejections go through ``process_batch`` in order, which equals the per-record calls; so
the result equals translating each record and calling ``process_impression`` / ``process_feedback`` on its
section 1 events one by one (tests/pipeline/stream/test_mapped.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rankwatch.pipeline.events.deadletter import DeadLetter, DeadLetterSink
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import Rejection
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.stream.batch import process_batch
from rankwatch.pipeline.stream.prepare import PreparedRows

StreamProcessor = Any  # pipeline.stream.processor.StreamProcessor (imports this module)


class OriginalBytes:
    """A dead-letter sink that swaps a translated event's bytes for the message it came from.

    ``originals`` maps ``id(translated bytes)`` to the original bytes; the translated objects stay alive
    (in the batch's list) while the core runs, so their ids cannot be reused meanwhile. Per-record callers
    set ``current`` to the message around each call instead (and back to None after).
    """

    def __init__(self, sink: DeadLetterSink) -> None:
        self.sink = sink
        self.originals: dict[int, bytes] = {}
        self.current: bytes | None = None  # per-record use: the message of the event being processed

    def send(self, letter: DeadLetter) -> None:
        original = self.current if self.current is not None else self.originals.get(id(letter.raw))
        if original is not None:
            detail = f"{letter.detail}; mapped to {letter.raw[:300].decode('utf-8', 'replace')}"
            letter = DeadLetter(letter.stream, original, letter.reason, detail, letter.source)
        self.sink.send(letter)


class Translated(NamedTuple):
    """What a batch's messages were translated to, elsewhere (``rankwatch replay``'s log reader translates
    every line to order it): ``single``, the one section 1 event of each message when every message maps to
    exactly one (the usual batch), else None and ``each``, ``translator.translate_kinds`` of the batch."""

    single: list[bytes] | None
    each: list[list[bytes] | Rejection] | None

    @classmethod
    def of(cls, translated: list[list[bytes] | Rejection]) -> Translated:
        single = [o[0] for o in translated if type(o) is list and len(o) == 1]
        return cls(single, None) if len(single) == len(translated) else cls(None, translated)


def process_mapped_batch(
    proc: StreamProcessor, translator: Any, kinds: Sequence[bool], values: Sequence[bytes], *,
    partition: int | None = None, offsets: Sequence[int] | None = None,
    topics: tuple[str, str] = ("impressions", "clicks"), source_of: Callable[[int], SourceRef] | None = None,
    translated: Translated | None = None, rows: PreparedRows | None = None,
) -> list[PublishedWindow]:
    """:meth:`StreamProcessor.process_batch` for messages in the team's schema (see module docstring).

    Every section 1 event a message maps to carries the message's offset; a message that cannot be read is
    counted and dead-lettered with its own bytes and source, at its place in the order. ``translated``: the
    batch's translation when the caller has it; ``rows``: the batch path's rows of the first events of
    ``translated.single`` (ignored otherwise).
    """
    out: list[PublishedWindow] = []
    run_kinds: list[bool] = []
    run_values: list[bytes] = []
    run_offsets: list[int] = []
    run_index: list[int] = []  # the message each run value came from (for source_of)
    sink = proc.dead_letters
    wrapper = OriginalBytes(sink) if sink is not None else None
    originals = wrapper.originals if wrapper is not None else None
    if translated is None:
        translated = Translated.of(translator.translate_kinds(kinds, values))
    single, each = translated

    def flush(run_rows: PreparedRows | None = None) -> None:
        nonlocal out
        if run_values:
            outer, first = source_of, run_index[:]
            out += process_batch(proc, run_kinds, run_values, partition=partition,
                                 offsets=run_offsets if offsets is not None else None, topics=topics,
                                 source_of=None if outer is None else (lambda j: outer(first[j])), rows=run_rows)
            run_index.clear()
            run_kinds.clear()
            run_values.clear()
            run_offsets.clear()

    if wrapper is not None:
        proc.dead_letters = wrapper
    try:
        if single is not None:  # the usual poll: one section 1 event per message, none rejected
            run_kinds[:], run_values[:], run_index[:] = kinds, single, range(len(values))
            if offsets is not None:
                run_offsets[:] = offsets
            if originals is not None:
                originals.update((id(v), raw) for v, raw in zip(single, values, strict=True) if v is not raw)
            flush(rows)
        else:
            assert each is not None
            for i, raw in enumerate(values):
                kind = kinds[i]
                native: Any = each[i]
                if type(native) is Rejection:
                    flush()
                    src = (source_of(i) if source_of is not None
                           else None if offsets is None else SourceRef(topics[0 if kind else 1], partition, offsets[i]))  # type: ignore[arg-type]
                    proc.reject("impressions" if kind else "clicks", raw, native.reason, native.detail, src)
                    continue
                for value in native:
                    run_kinds.append(kind)
                    run_values.append(value)
                    run_index.append(i)
                    if offsets is not None:
                        run_offsets.append(offsets[i])
                    if originals is not None and value is not raw:
                        originals[id(value)] = raw
        flush()
    finally:
        if wrapper is not None:
            proc.dead_letters = sink
    return out
