"""``rankwatch offline INPUT...``: a baseline from an evaluation set (CSV, JSONL or Parquet)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from rankwatch.errors import ConfigError, RankwatchError

if TYPE_CHECKING:
    from rankwatch.pipeline.offline import BaselineResult

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
              help="table: for people; json: the result document (SPEC section 4).")
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
def command(
    inputs: tuple[str, ...], fmt: str, output: str | None, k: str | None, ndcg_k: str | None,
    map_k: str | None, precision_k: str, recall_k: str, hit_rate_k: str, gauc_group: str, gauc_weight: str,
    gain: str, map_norm: str, no_relevant: str, by: str, max_label_values: int, skip_invalid: bool,
) -> None:  # fmt: skip
    """Compute MRR, NDCG@k, MAP@k, precision/recall/hit rate@k, AUC-ROC, AUC-PR, GAUC, the positive rate
    and click-through by position per slice of an evaluation set.

    INPUT files are CSV, JSONL or Parquet with one row per shown item: request_id, item_id, score, label
    and optionally position, segment, surface, variant, model, user_id (for GAUC by user).
    """
    from rankwatch.pipeline.offline import compute_baseline, write_baseline
    from rankwatch.pipeline.options import MetricOptions
    from rankwatch.pipeline.readers import InvalidEvaluationData, read_evaluation_files
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
    try:
        evalset = read_evaluation_files(list(inputs), skip_invalid=skip_invalid)
        result = compute_baseline(evalset, options=options, slice_spec=slice_spec)
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
        _print_table(result, output)


def _with_error(value: float | None, se: float | None) -> str:
    """``0.8123 ± 0.0061`` (half-width of the 95 % Wald interval), the value alone without an SE."""
    if value is None:
        return "-"
    text = _METRIC_FORMAT.format(value)
    return text if se is None else f"{text} ± {_METRIC_FORMAT.format(_Z95 * se)}"


_Z95 = 1.959963984540054


def _print_table(result: BaselineResult, output: str | None) -> None:
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
    if output:
        notes.append(f"baseline written to {output}")
    notes.append("metric cells: value ± 1.96 standard errors (a 95 % interval; '-' where undefined)")
    for note in notes:
        console.print(note)
