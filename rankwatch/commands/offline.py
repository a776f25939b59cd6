"""``rankwatch offline INPUT...``: a baseline from an evaluation set (CSV, JSONL or Parquet)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from rankwatch.errors import ConfigError, RankwatchError

if TYPE_CHECKING:
    from rankwatch.pipeline.offline.baseline import BaselineResult

_METRIC_FORMAT = "{:.4f}"


class _SystemClock:
    """The wall clock, for the baseline's creation time (the pipeline itself never reads it)."""

    def now(self) -> datetime:
        return datetime.now(UTC)


def _cutoffs(value: str | None, option: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    try:
        ks = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{option} takes a comma list of positive integers, got {value!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise ConfigError(f"{option} takes a comma list of positive integers, got {value!r}")
    return tuple(dict.fromkeys(ks))  # keep order, drop repeats


@click.command(name="offline")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: for people; json: the result document (docs/cli.md).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write a baseline file (result + metadata) that the service loads.")
@click.option("--k", "k", default=None, metavar="K[,K...]",
              help="Cut-offs for both NDCG@k and MAP@k (default NDCG@5,10 and MAP@10).")
@click.option("--ndcg-k", default=None, metavar="K[,K...]", help="NDCG cut-offs (overrides --k).")
@click.option("--map-k", default=None, metavar="K[,K...]", help="MAP cut-offs (overrides --k).")
@click.option("--precision-k", default="5,10", show_default=True, metavar="K[,K...]", help="precision@k cut-offs.")
@click.option("--recall-k", default="10", show_default=True, metavar="K[,K...]", help="recall@k cut-offs.")
@click.option("--hit-rate-k", default="10", show_default=True, metavar="K[,K...]", help="hit_rate@k cut-offs.")
@click.option("--gauc-group", type=click.Choice(["user", "request"]), default="user", show_default=True,
              help="GAUC groups: users (needs a user_id column) or requests.")
@click.option("--gauc-weight", type=click.Choice(["impressions", "clicks"]), default="impressions", show_default=True,
              help="GAUC weight of a group: its shown items or its relevant items.")
@click.option("--gain", type=click.Choice(["exponential", "linear"]), default="exponential", show_default=True,
              help="NDCG gain: 2^rel - 1 or rel.")
@click.option("--map-norm", type=click.Choice(["relevant", "min-relevant-k"]), default="relevant",
              show_default=True, help="Divide AP@k by R (trec_eval map_cut) or by min(R, k).")
@click.option("--no-relevant", type=click.Choice(["skip", "zero"]), default="skip", show_default=True,
              help="Requests without a relevant item: leave out of MRR/NDCG/MAP, or count as 0.")
@click.option("--by", default="segment,surface", show_default=True, metavar="LABEL[,LABEL...]",
              help="Slice labels among segment, surface, variant, model ('' for the overall slice only).")
@click.option("--max-label-values", type=click.IntRange(min=1), default=50, show_default=True,
              help="Distinct values kept per label; the rest fold into __other__.")
@click.option("--skip-invalid", is_flag=True, help="Skip and count invalid rows instead of failing.")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="local: streaming in this process; spark: PySpark (pip install 'rankwatch[spark]').")
@click.option("--spark-master", default="local[2]", show_default=True, metavar="URL",
              help="Spark master for --engine spark (local[N] or a cluster URL).")
@click.option("--memory-limit", default="1G", show_default=True, metavar="SIZE",
              help="Peak memory budget of the local engine (e.g. 768M, 2G); sets the batch size.")
@click.option("--layout", type=click.Choice(["auto", "grouped", "scattered"]), default="auto", show_default=True,
              help="grouped: a request's rows are contiguous; scattered: group out of core via spill files; "
                   "auto: grouped until a request comes back.")
@click.option("--spill-dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the spill files of scattered rows (default: the system temp folder).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--columns", "columns_text", default=None, metavar="FIELD=COLUMN[,...]",
              help="The inputs' own column names, e.g. request_id=qid,label=rel (any offline column).")
def command(
    inputs: tuple[str, ...], fmt: str, output: str | None, k: str | None, ndcg_k: str | None,
    map_k: str | None, precision_k: str, recall_k: str, hit_rate_k: str, gauc_group: str, gauc_weight: str,
    gain: str, map_norm: str, no_relevant: str, by: str, max_label_values: int, skip_invalid: bool,
    engine: str, spark_master: str, memory_limit: str, layout: str, spill_dir: str | None, progress: bool | None,
    columns_text: str | None,
) -> None:  # fmt: skip
    """Compute MRR, NDCG@k, MAP@k, precision/recall/hit rate@k, AUC-ROC, AUC-PR, GAUC, the positive rate
    and click-through by position per slice of an evaluation set.

    INPUT files are CSV, JSONL (also .gz) or Parquet with one row per shown item: request_id, item_id,
    score, label and optionally position, segment, surface, variant, model, user_id (for GAUC by user). An
    INPUT may be a directory (hive-partitioned Parquet, say) or a glob. Inputs of any size are read in
    batches within --memory-limit.
    """
    from rankwatch.pipeline.metrics.options import MetricOptions
    from rankwatch.pipeline.offline.baseline import write_baseline
    from rankwatch.pipeline.offline.readers import InvalidEvaluationData
    from rankwatch.pipeline.slicing import SliceSpec

    both = _cutoffs(k, "--k")
    try:
        options = MetricOptions(
            ndcg_cutoffs=_cutoffs(ndcg_k, "--ndcg-k") or both or (5, 10),
            map_cutoffs=_cutoffs(map_k, "--map-k") or both or (10,),
            gain=gain,  # type: ignore[arg-type]
            map_normalization=map_norm.replace("-", "_"),  # type: ignore[arg-type]
            no_relevant=no_relevant,  # type: ignore[arg-type]
            precision_cutoffs=_cutoffs(precision_k, "--precision-k") or (),
            recall_cutoffs=_cutoffs(recall_k, "--recall-k") or (),
            hit_rate_cutoffs=_cutoffs(hit_rate_k, "--hit-rate-k") or (),
            gauc_group=gauc_group,  # type: ignore[arg-type]
            gauc_weight=gauc_weight,  # type: ignore[arg-type]
        )
        labels = tuple(dict.fromkeys(p.strip() for p in by.split(",") if p.strip()))
        slice_spec = SliceSpec(by=labels, max_values_per_label=max_label_values)
    except ValueError as e:
        raise ConfigError(f"bad option: {e}") from None
    from rankwatch.pipeline.offline.renames import parse_columns

    try:
        columns = parse_columns(columns_text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    from rankwatch.pipeline.offline.streaming import StreamStats

    budget = parse_size(memory_limit, "--memory-limit")
    stats = StreamStats()
    show = sys.stderr.isatty() if progress is None else progress
    try:
        if engine == "spark":
            result = _spark_baseline(inputs, options, slice_spec, skip_invalid, spark_master, columns)
        else:
            result = _local_baseline(inputs, options, slice_spec, skip_invalid, budget, layout, spill_dir, show, stats,
                                     columns)  # fmt: skip
    except FileNotFoundError as e:
        raise RankwatchError(str(e).strip("'\"")) from None
    except InvalidEvaluationData as e:
        raise RankwatchError(str(e)) from None
    if output:
        try:
            write_baseline(output, result, clock=_SystemClock())
        except OSError as e:
            raise RankwatchError(f"cannot write {output}: {e.strerror or e}") from None
    if fmt == "json":
        click.echo(json.dumps(result.document(), indent=2, allow_nan=False))
        if not result.overall.gauc.available:
            click.echo("rankwatch: note: GAUC by user is null: the input has no user_id column", err=True)
    else:
        _print_table(result, output, stats if engine == "local" else None)


def _with_error(value: float | None, se: float | None) -> str:
    """``0.8123 ± 0.0061`` (half-width of the 95 % Wald interval), the value alone without an SE."""
    if value is None:
        return "-"
    text = _METRIC_FORMAT.format(value)
    return text if se is None else f"{text} ± {_METRIC_FORMAT.format(_Z95 * se)}"


_Z95 = 1.959963984540054


def parse_size(value: str, option: str) -> int:
    """Bytes of ``512M``, ``1G``, ``1.5GiB``, ``800000000`` (powers of 1024 for the suffixes)."""
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        size = int(float(number) * scale)
    except ValueError:
        size = 0
    if size < 384 << 20:  # MIN_MEMORY_LIMIT of pipeline.offline.streaming
        raise ConfigError(f"{option} takes a size of at least 384M such as 768M or 2G, got {value!r}")
    return size


def _local_baseline(
    inputs: tuple[str, ...], options: Any, slice_spec: Any, skip_invalid: bool, budget: int, layout: str,
    spill_dir: str | None, show_progress: bool, stats: Any, columns: Any = None,
) -> BaselineResult:  # fmt: skip
    from rankwatch.pipeline.offline.streaming import stream_baseline

    if not show_progress:
        return stream_baseline(list(inputs), options=options, slice_spec=slice_spec, skip_invalid=skip_invalid,
                               memory_limit=budget, layout=layout, spill_dir=spill_dir,  # type: ignore[arg-type]
                               stats=stats, columns=columns)  # fmt: skip
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    bar_columns = (TextColumn("[bold]{task.fields[phase]}"), TextColumn("{task.fields[rows]:>14,} rows"),
               TextColumn("{task.fields[requests]:>12,} requests"), TextColumn("{task.fields[rate]:>10} rows/s"),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*bar_columns, transient=True, console=_stderr_console()) as bar:
        task = bar.add_task("offline", phase="reading", rows=0, requests=0, rate="-")

        def report(phase: str, rows: int, requests: int) -> None:
            elapsed = bar.tasks[0].elapsed or 0.0
            rate = f"{rows / elapsed:,.0f}" if elapsed > 0 else "-"
            bar.update(task, phase=phase, rows=rows, requests=requests, rate=rate)

        return stream_baseline(list(inputs), options=options, slice_spec=slice_spec, skip_invalid=skip_invalid,
                               memory_limit=budget, layout=layout, spill_dir=spill_dir,  # type: ignore[arg-type]
                               progress=report, stats=stats, columns=columns)  # fmt: skip


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _spark_baseline(
    inputs: tuple[str, ...], options: Any, slice_spec: Any, skip_invalid: bool, master: str, columns: Any = None
) -> BaselineResult:
    try:
        from rankwatch.spark import spark_baseline_from_files
    except ImportError as e:
        raise RankwatchError(f"--engine spark needs pyspark: pip install 'rankwatch[spark]' ({e})") from None
    from rankwatch.pipeline.offline.readers import InvalidEvaluationData

    try:
        return spark_baseline_from_files(list(inputs), options=options, slice_spec=slice_spec,
                                         skip_invalid=skip_invalid, master=master, columns=columns)  # fmt: skip
    except (InvalidEvaluationData, FileNotFoundError, RankwatchError):
        raise
    except Exception as e:  # Py4J / PySpark errors carry a JVM stack trace: keep its first line
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise RankwatchError(f"spark: {first}") from None


def _print_table(result: BaselineResult, output: str | None, stats: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    # Off a terminal (a pipe, a file) nothing is folded or cut: the table keeps its natural width.
    console = Console(width=None if sys.stdout.isatty() else 1000, soft_wrap=False, highlight=False)
    names = result.options.metric_names
    labels = list(result.slice_spec.by)
    table = Table(title="rankwatch offline baseline", title_justify="left")
    for lbl in labels or ["slice"]:
        table.add_column(lbl)
    for col in ("requests", "with relevant", "items", *names):
        table.add_column(col, justify="right")

    def row(values: dict[str, Any], ses: dict[str, float | None]) -> list[str]:
        requests = int(values["requests"])
        share = values["requests_with_relevant"] / requests if requests else 0.0
        cells = [f"{requests:,}", f"{share:.1%}", f"{int(values['items']):,}"]
        cells += [_with_error(values[n], ses.get(n)) for n in names]
        return cells

    table.add_row(*(["overall"] + ["all"] * (len(labels) - 1) if labels else ["overall"]),
                  *row(result.overall.values(), result.overall.stderrs()), style="bold")  # fmt: skip
    for key, agg in sorted(result.slices.items()):
        table.add_row(*(value for _, value in key), *row(agg.values(), agg.stderrs()))
    console.print(table)
    notes = [f"{result.rows:,} rows from {', '.join(result.inputs)}"]
    if result.skipped_rows:
        reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(result.skipped_by_reason.items()))
        notes.append(f"skipped {result.skipped_rows:,} invalid rows ({reasons})")
    for lbl, n in sorted(result.label_overflow.items()):
        notes.append(f"{n:,} requests folded into {lbl}=__other__ (cap {result.slice_spec.max_values_per_label})")
    if result.overall.gauc.available is False:
        notes.append("GAUC by user is null: the input has no user_id column (or use --gauc-group request)")
    if stats is not None and stats.batches:
        how = f"streamed in {stats.batches:,} batches of up to {stats.batch_rows:,} rows, {stats.layout} layout"
        if stats.layout == "scattered":
            how += f" ({stats.partitions:,} partitions, {stats.spilled_bytes / 2**20:,.0f} MiB spilled)"
        notes.append(how)
    if output:
        notes.append(f"baseline written to {output}")
    notes.append("metric cells: value ± 1.96 standard errors (a 95 % interval; '-' where undefined)")
    for note in notes:
        console.print(note)
