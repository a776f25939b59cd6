"""``rankwatch replay``: the streaming core over logged events (JSONL, optionally gzip), in event-time order.

The files are read in chunks of lines and merged by event time chunk by chunk
(:class:`pipeline.events.logs.EventLogMerge`: the order of a per-line merge by ``ts``, impressions before
clicks at equal times), in a child process a batch ahead (:mod:`rankwatch.commands.log_reader`), and each
merged batch goes through the streaming core's batch path in one call. The child also makes the batch path's
stateless rows (decoded, checked, packed: :mod:`pipeline.stream.prepare`) while the core is busy, so the
core's process mostly applies them (with one file a stream it makes them as it reads the lines, and takes the
merge's times from them: :mod:`rankwatch.commands.rows_as_read`); with ``--config`` it hands on each line's
translation, made once when the merge read the line's event time (:class:`KeptTranslations`). A
line whose ``ts`` cannot be read reaches the processor where a per-line merge would have handed it over,
and is rejected with its reason (counted and dead-lettered, never lost).
Each file is assumed to be roughly in time order: disorder beyond ``--allowed-disorder`` makes events late,
as it would online. The watermark follows event time only (the replay never ticks an idle clock); at the end
everything is finalized and every window published.
"""

from __future__ import annotations

import functools
import gc
import json
import multiprocessing
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from rankwatch.errors import ConfigError, RankwatchError

if TYPE_CHECKING:
    from rankwatch.pipeline.stream.mapped import Translated
    from rankwatch.pipeline.stream.prepare import PackedRows

STREAM_ORDER = {"impressions": 0, "clicks": 1}


def _csv(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for raw in values for v in raw.split(",") if v.strip()]


@click.command(name="replay")
@click.option("--impressions", "impression_files", multiple=True, metavar="FILE",
              help="Impression log (JSONL or .jsonl.gz); repeat the option or separate with commas.")
@click.option("--clicks", "click_files", multiple=True, metavar="FILE",
              help="Feedback log (JSONL or .jsonl.gz); repeat the option or separate with commas.")
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
@click.option("--windows-out", type=click.Path(dir_okay=False), help="Append one JSON line per published window.")
@click.option("--dead-letter", type=click.Path(dir_okay=False), help="Append rejected lines with their reason (JSONL).")
@click.option("--window", "windows", multiple=True, metavar="SIZE",
              help="Window sizes, e.g. 5m,1h (default: 5m and 1h).")
@click.option("--attribution-window", default="30m", show_default=True, help="Feedback attribution window.")
@click.option("--allowed-disorder", default="60s", show_default=True, help="Event-time disorder tolerated.")
@click.option("--by", "by", multiple=True, metavar="LABELS",
              help="Slice labels, from segment, surface, variant, model (default: segment,surface).")
@click.option("--k", "ks", multiple=True, metavar="K", help="NDCG@k and MAP@k cut-offs, e.g. 5,10 (default: NDCG@5,10, MAP@10).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Read the events in the schema of this config's [events.*] tables (docs/mapping.md).")
def command(
    impression_files: tuple[str, ...], click_files: tuple[str, ...], fmt: str, windows_out: str | None,
    dead_letter: str | None, windows: tuple[str, ...], attribution_window: str, allowed_disorder: str,
    by: tuple[str, ...], ks: tuple[str, ...], config_file: str | None,
) -> None:
    """Replay logged impressions and clicks through the streaming join and print the metrics."""
    from rankwatch.commands.event_files import events_translator
    from rankwatch.commands.log_reader import open_merge
    from rankwatch.commands.rows_as_read import RowsAsRead
    from rankwatch.malloc import keep_freed_blocks
    from rankwatch.pipeline.stream.prepare import BatchSpec

    keep_freed_blocks()  # the kernel's temporaries reused, not mapped and faulted in each time (rankwatch/malloc.py)

    config = _config(windows, attribution_window, allowed_disorder, by, ks)
    imp_paths = [_existing(p) for p in _csv(impression_files)]
    clk_paths = [_existing(p) for p in _csv(click_files)]
    if not imp_paths:
        raise ConfigError("replay needs at least one --impressions FILE")
    files = [(p, "impressions") for p in imp_paths] + [(p, "clicks") for p in clk_paths]
    translator, opener = events_translator(config_file, config.max_event_bytes, files)
    # The reader's process (log_reader.py) also decodes, checks and packs the events (the batch path's
    # stateless half) while the core is busy. A team's schema is translated where the lines are read (their
    # event times order the merge): the translations are kept and handed on, not made twice. It starts
    # before the core's modules are imported (the metric code, numpy), so that it reads and prepares
    # meanwhile; nothing it runs needs them.
    kept = None if translator is None else KeptTranslations(translator)
    ts_of = None if kept is None else kept.ts_of
    prepare: Any = functools.partial(_made_by_reader, kept, BatchSpec.of(config), {})
    child_ts_of = None
    core_step = None  # the core's watermark step, in memory the reader's process shares
    if kept is None and RowsAsRead.applies([s for _, s in files]):  # each line decoded once (rows_as_read.py)
        core_step = multiprocessing.RawValue("q", _NO_STEP)
        as_read = RowsAsRead(BatchSpec.of(config), config, functools.partial(_step_of, core_step))
        child_ts_of = as_read.ts_of
        prepare = functools.partial(_rows_as_read, as_read)
    merge = open_merge(files, ts_of=ts_of, opener=opener, prepare=prepare, lines_needed=_lines_needed,
                       child_ts_of=child_ts_of)
    try:
        _replay(merge, config, translator, kept, fmt, windows_out, dead_letter, core_step)
    finally:
        merge.close()


def _replay(merge: Any, config: Any, translator: Any, kept: KeptTranslations | None, fmt: str,
            windows_out: str | None, dead_letter: str | None, core_step: Any = None) -> None:
    """The core's half of :func:`command`: feed ``merge``'s batches, print the result document; ``core_step``:
    where the reader's process reads the core's watermark step (:class:`RowsAsRead`), told after each batch."""
    from rankwatch.commands.log_reader import batches_with_rows
    from rankwatch.commands.window_worker import start_window_worker
    from rankwatch.pipeline.clock import ManualClock
    from rankwatch.pipeline.events.deadletter import JsonlDeadLetterSink
    from rankwatch.pipeline.stream.processor import StreamProcessor

    sink = JsonlDeadLetterSink(dead_letter) if dead_letter else None
    clock = ManualClock()
    # With --config the processor reads the team's schema: it takes the reader's translations (translating a
    # line itself only where none was kept) and dead-letters a line as it was written.
    proc = StreamProcessor(config, clock=clock, dead_letters=sink, translator=translator)
    if windows_out is None:  # the result document reads the largest windows only: the others are counted, not summed
        largest = _largest(config)
        proc.count_only_windows([w for w in config.windows if w != largest])
    out_file: IO[str] | None = open(windows_out, "a", encoding="utf-8") if windows_out else None  # noqa: SIM115
    published: list[Any] = []
    user_keys: dict[str, int] = {}  # user_id -> its GAUC key, for the rows made here (a cache, as in prepare_rows)

    def emit(windows: list[Any]) -> None:
        for w in windows:
            published.append(w)
            if out_file is not None:
                out_file.write(json.dumps(w.document()) + "\n")

    def finish() -> dict[str, Any]:
        if out_file is not None:
            out_file.flush()
        return _overall_document(published, config)

    # The kernel, the windows and the result document run in a worker process where they can
    # (window_worker.py). It is forked now, so ``emit`` and ``finish`` run there on its own copies of
    # ``published`` and the open ``out_file``: the windows are published, written and summed where they are made.
    worker = start_window_worker(proc, emit, finish)
    # What is loaded by now (modules, config) outlives the replay: out of the full collections the join's
    # objects trigger (each walked every object, numpy's modules included; unfrozen at the end). The replay's
    # objects are freed by reference counting (no cycles on its paths), so the young collections every 700
    # allocations found next to nothing to free (359 objects in 306 collections of a 100k-request replay, 0.2 s).
    # One every _GC_YOUNG allocations until the end: 14 collections (docs/benchmarks.md has the figures).
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG, *thresholds[1:])
    try:
        with _progress(merge.size, merge.position) as advance:
            for kinds, values, sources, made in batches_with_rows(merge):
                if made is None:  # read in this process: the core prepares the rows; the translations were kept here
                    made = (None if kept is None else kept.take(kinds, values), None)
                translated, packed = made
                # the reader's rows (PackedRows), those of a kind it did not make made here
                rows = None if packed is None else packed.completed(proc.batch_spec, kinds, values, user_keys)
                emit(proc.process_batch(kinds, values, source_of=sources, rows=rows, translated=translated))
                if core_step is not None and proc.watermark_step is not None:
                    core_step.value = proc.watermark_step
                advance(len(values))
        emit(proc.flush())
        doc = finish() if worker is None else worker.finish()
    except BaseException:
        if worker is not None:
            worker.stop()
        raise
    finally:
        if out_file is not None:
            out_file.close()
        if sink is not None:
            sink.close()
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    summary = _summary(proc.stats())
    if fmt == "json":
        click.echo(json.dumps(doc))
        click.echo(summary, err=True)
    else:
        _print_table(doc)
        click.echo(summary)
    from rankwatch.cli import skip_teardown

    # files closed, the reader and the worker ended: the process may end without freeing each object
    skip_teardown(proc, user_keys)


_GC_YOUNG = 10_000  # allocations between two young collections during a replay (Python's default: 700)
_PREPARE_STEP = 256  # records the log reader prepares between two looks at whether it is still ahead


def _made_by_reader(kept: KeptTranslations | None, spec: Any, user_keys: dict[str, int], kinds: list[bool],
                    values: list[bytes], caught_up: Any) -> tuple[Translated | None, Any]:
    """What the log reader's process hands on with a batch: its translations (a team's schema) and the batch
    path's rows of its first events (:func:`_rows_until`)."""
    if kept is None:
        return None, _rows_until(spec, user_keys, kinds, values, caught_up)
    translated = kept.take(kinds, values)
    if translated.single is None:  # a rejection or a message of several events: the core takes it from here
        return translated, None
    return translated, _rows_until(spec, user_keys, kinds, translated.single, caught_up)


_NO_STEP = -(2**63)  # the core has no watermark yet


def _step_of(shared: Any) -> int | None:
    """The core's watermark step as it last told the reader (None before it had one)."""
    step = shared.value
    return None if step == _NO_STEP else int(step)


def _rows_as_read(as_read: Any, kinds: list[bool], values: Sequence[bytes], caught_up: Any) -> tuple[None, Any]:
    """:func:`_made_by_reader` where the rows were made as the lines were read (:mod:`rankwatch.commands.rows_as_read`):
    every batch's, whatever the core's progress."""
    return None, as_read.take(kinds, caught_up)


class KeptTranslations:
    """A team's messages translated once, when the merge reads their event times, and kept until their batch.

    ``ts_of`` is the merge's ``ts_of`` (:meth:`pipeline.events.translate.Translator.event_ts_many`, keeping
    each translation by the line's identity and stream); ``take`` hands on the kept translations of a batch's
    lines. An entry holds its line, so its identity (the key) is not reused while it waits; the merge emits
    every line it read once, so nothing stays behind; a line not kept (one object read twice: CPython shares
    one-byte strings) is translated again, to the same result.
    """

    def __init__(self, translator: Any) -> None:
        self.translator = translator
        self._kept: dict[tuple[int, bool], tuple[bytes, Any]] = {}

    def ts_of(self, stream: str, lines: list[bytes]) -> Any:
        """The merge's ``ts_of``: the lines' event times, their translations kept."""
        kept, kind = self._kept, stream == "impressions"

        def keep(raw: bytes, translation: Any) -> None:
            kept[id(raw), kind] = (raw, translation)  # the entry holds the line: its id is not reused meanwhile

        return self.translator.event_ts_many(stream, lines, keep)

    def take(self, kinds: list[bool], values: Sequence[bytes]) -> Translated:
        """The kept translations of a batch's lines (removed from here)."""
        from rankwatch.pipeline.stream.mapped import Translated

        kept, translate = self._kept, self.translator.translate
        each = []
        for kind, raw in zip(kinds, values, strict=True):
            entry = kept.pop((id(raw), kind), None)
            each.append(translate("impressions" if kind else "clicks", raw) if entry is None else entry[1])
        return Translated.of(each)


def _lines_needed(made: tuple[Translated | None, PackedRows | None], n: int) -> bool:
    """Whether the core reads any of a batch's ``n`` lines besides the rows the reader made: unless they are the
    clean rows of every line and their maker vouched that none is a line the per-record path takes (a second
    impression of a request the core may hold, or one at the pending cap: :class:`RowsAsRead`'s guard); the batch
    path reads a line only where the per-record path takes it, or where it makes the rows itself; a team's schema
    keeps its lines for its dead letters."""
    translated, rows = made
    return (translated is not None or rows is None or rows.n_records != n or not rows.every_row_clean
            or bool(rows.missing) or not rows.vouched)


def _rows_until(spec: Any, user_keys: dict[str, int], kinds: list[bool], values: list[bytes],
                caught_up: Any) -> Any:
    """What the log reader's process makes of a batch: the stateless rows of its first records, until the
    core has caught up with the reader (it makes the rest itself), packed for the pipe (:class:`PackedRows`)."""
    from rankwatch.pipeline.stream.prepare import PreparedRows, prepare_rows

    parts = []
    for start in range(0, len(values), _PREPARE_STEP):
        if caught_up():
            break
        parts.append(prepare_rows(spec, kinds[start:start + _PREPARE_STEP], values[start:start + _PREPARE_STEP], user_keys))
    return PreparedRows.concat(parts).packed() if parts else None


def _config(windows: tuple[str, ...], attribution: str, disorder: str, by: tuple[str, ...], ks: tuple[str, ...]) -> Any:
    from rankwatch.pipeline.metrics.options import MetricOptions
    from rankwatch.pipeline.slicing import SliceSpec
    from rankwatch.pipeline.stream.config import StreamConfig
    from rankwatch.pipeline.stream.durations import parse_duration_ms, parse_duration_or_zero_ms

    try:
        sizes = tuple(_csv(windows)) or ("5m", "1h")
        for s in sizes:
            parse_duration_ms(s)
        attr_ms = parse_duration_ms(attribution)
        disorder_ms = parse_duration_or_zero_ms(disorder)
        spec = SliceSpec(by=tuple(_csv(by))) if by else SliceSpec()
        cut = tuple(int(k) for k in _csv(ks))
        options = MetricOptions(ndcg_cutoffs=cut, map_cutoffs=cut) if cut else MetricOptions()
        return StreamConfig(windows=sizes, attribution_window_ms=attr_ms, allowed_disorder_ms=disorder_ms,
                            slice_spec=spec, metric_options=options)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _existing(path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise RankwatchError(f"no such file: {path}")
    return p


class _progress:
    """A rich progress bar over input bytes, only when stderr is a terminal."""

    def __init__(self, total: int, done: Any) -> None:
        self.total = total
        self.done = done
        self._bar: Any = None

    def __enter__(self) -> Any:
        if not sys.stderr.isatty():
            return lambda events: None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        self._bar = Progress("replay", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("replay", total=self.total)

        def advance(events: int) -> None:
            self._bar.update(task, completed=self.done())

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _largest(config: Any) -> str:
    """The window size whose windows the result document merges."""
    from rankwatch.pipeline.stream.durations import parse_duration_ms

    return max(config.windows, key=parse_duration_ms)  # type: ignore[no-any-return]


def _overall_document(published: list[Any], config: Any) -> dict[str, Any]:
    """The result document over the whole replay: the windows of the largest size merged.

    Its entries are computed by two threads: closing every user's GAUC group and the clustered AUC variances
    of a large replay are sorts of every item, which release the GIL (the reader process has ended by then,
    so the second core is free); the document is the one a single thread builds.
    """
    from concurrent.futures import ThreadPoolExecutor

    from rankwatch.pipeline.metrics.aggregates import RankingAggregate
    from rankwatch.pipeline.metrics.result import result_document

    largest = _largest(config)
    overall = RankingAggregate(config.metric_options)
    slices: dict[Any, RankingAggregate] = {}
    for w in published:
        if w.window != largest:
            continue
        overall.merge(w.overall)
        for key, agg in w.slices.items():
            if key in slices:
                slices[key].merge(agg)
            else:
                slices[key] = agg.copy()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rankwatch-result") as pool:
        return result_document(overall, slices, map_entries=pool.map)


def _summary(stats: Any) -> str:
    parts = []
    for stream, counts in stats.outcomes.items():
        parts.append(f"{stream}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    rejects = ", ".join(f"{s}/{r} {n}" for (s, r), n in sorted(stats.rejects.items()))
    line = "; ".join(parts)
    if rejects:
        line += f"; rejected by reason: {rejects}"
    published = ", ".join(f"{k} {v}" for k, v in stats.windows_published.items())
    return f"replay: {line}; windows published: {published}; evicted {stats.evicted_requests}"


def _print_table(doc: dict[str, Any]) -> None:
    """The result document as ``rankwatch offline --format table`` shows a baseline: a row per slice, each
    metric as its value ± 1.96 standard errors."""
    from rich.console import Console
    from rich.table import Table

    from rankwatch.commands.offline import _with_error

    labels = [k for k in ("segment", "surface", "variant", "model") if doc["slices"] and k in doc["slices"][0]]
    names = list(doc["overall"].get("stderr", {}))
    console = Console(width=None if sys.stdout.isatty() else 1000, soft_wrap=False, highlight=False)
    table = Table(title="rankwatch replay (largest window, merged)", title_justify="left")
    for lbl in labels or ["slice"]:
        table.add_column(lbl)
    for col in ("requests", "with relevant", "items", *names):
        table.add_column(col, justify="right")

    def row(entry: dict[str, Any]) -> list[str]:
        requests = int(entry["requests"])
        share = entry["requests_with_relevant"] / requests if requests else 0.0
        ses = entry.get("stderr", {})
        return [f"{requests:,}", f"{share:.1%}", f"{int(entry['items']):,}",
                *(_with_error(entry.get(n), ses.get(n)) for n in names)]

    table.add_row(*(["overall"] + ["all"] * (len(labels) - 1) if labels else ["overall"]), *row(doc["overall"]),
                  style="bold")
    for entry in doc["slices"]:
        table.add_row(*(str(entry[lbl]) for lbl in labels), *row(entry))
    console.print(table)
    console.print("metric cells: value ± 1.96 standard errors (a 95 % interval; '-' where undefined); "
                  "GAUC group counts and click-through by position are in --format json")
