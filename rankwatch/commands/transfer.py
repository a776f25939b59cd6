"""``rankwatch transfer LEDGER...``: does an offline gain show up online? (SPEC section 7)

Reads transfer ledgers (one comparison a line, :mod:`rankwatch.pipeline.transfer.ledger`) and prints, per
group of comparisons (a metric, or a metric and a segment with ``--by segment``), how online differences
follow offline ones: the OLS and errors-in-variables slopes, the corrected correlation, sign agreement,
Kendall's tau-b, each comparison's ratio with its Fieller interval and, with ``--candidate``, the online
difference a new model's offline difference predicts. docs/transfer.md explains the statistics.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click

from rankwatch.errors import ConfigError, RankwatchError


def parse_candidate(text: str) -> tuple[float, float]:
    """``"DIFF,STDERR"`` -> ``(diff, stderr)``; ConfigError naming the option otherwise."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        diff, stderr = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"--candidate takes DIFF,STDERR (two numbers), got {text!r}") from None
    if not (math.isfinite(diff) and math.isfinite(stderr)) or stderr < 0:
        raise ConfigError(f"--candidate needs a finite DIFF and a finite STDERR >= 0, got {text!r}")
    return diff, stderr


@click.command(name="transfer")
@click.argument("ledgers", nargs=-1, required=True, metavar="LEDGER...")
@click.option("--metric", default=None, metavar="M", help="Only comparisons of this (offline) metric.")
@click.option("--by", type=click.Choice(["segment"]), default=None, help="One group per segment too.")
@click.option("--candidate", default=None, metavar="DIFF,STDERR",
              help="A new model's offline difference and its SE: predict its online difference.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--bootstrap", "resamples", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Bootstrap resamples over comparisons.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def command(
    ledgers: tuple[str, ...], metric: str | None, by: str | None, candidate: str | None, seed: int,
    resamples: int, fmt: str,
) -> None:  # fmt: skip
    """Across comparisons in LEDGER files: slopes, corrected correlation, sign agreement, ratios."""
    from rankwatch.pipeline.transfer.ledger import read_ledgers
    from rankwatch.pipeline.transfer.report import groups_document, transfer_groups

    cand = parse_candidate(candidate) if candidate is not None else None
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    entries = read_ledgers(ledgers)  # LedgerError: one line with file:line
    if metric is not None and entries and not any(e.metric == metric for e in entries):
        known = ", ".join(sorted({e.metric for e in entries}))
        raise RankwatchError(f"no comparison of metric {metric!r} in the ledgers (metrics: {known})")
    groups = transfer_groups(entries, metric=metric, by_segment=by == "segment", candidate=cand, seed=seed,
                             resamples=resamples)  # fmt: skip
    doc = groups_document(groups)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        _print_table(doc, groups, cand)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def _interval(pair: list[float] | None, digits: int = 3) -> str:
    return "-" if pair is None else f"[{pair[0]:+.{digits}f}, {pair[1]:+.{digits}f}]"


def _print_table(doc: dict[str, Any], groups: list[Any], candidate: tuple[float, float] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False, highlight=False)
    if not doc["groups"]:
        console.print("no comparisons in the ledgers")
        return
    summary = Table(title="transfer: online difference against offline difference, per group", title_justify="left")
    for col in ("metric", "online metric", "segment", "n", "slope OLS", "slope corrected [95 %]",
                "corr. corrected [95 %]", "sign agreement", "kendall tau-b"):
        summary.add_column(col, justify="left" if col in ("metric", "online metric", "segment") else "right")
    if candidate is not None:
        summary.add_column(f"predicted online at {candidate[0]:+g} [95 %]", justify="right")
    notes = []
    for g, obj in zip(doc["groups"], groups, strict=True):
        agreement = ("-" if g["sign_agreement"] is None
                     else f"{g['sign_agreement']:.0%} of {g['sign_agreement_n']}")  # fmt: skip
        row = [g["metric"], g["online_metric"], g["segment"], str(g["n"]), _num(g["slope_ols"]),
               f"{_num(g['slope_corrected'])} {_interval(g['slope_corrected_ci'])}",
               f"{_num(g['correlation_corrected'])} {_interval(g['correlation_corrected_ci'])}",
               agreement, _num(g["kendall_tau"])]  # fmt: skip
        if candidate is not None:
            row.append(f"{_num(g['predicted_online'], 4)} {_interval(g['predicted_online_ci'], 4)}")
        summary.add_row(*row)
        ci = obj.slope_corrected_ci
        if ci.valid < ci.resamples:
            if ci.kind == "jackknife":
                notes.append(f"{g['metric']}/{g['segment']}: slope defined in {ci.valid} of {ci.resamples} "
                             "leave-one-out fits (no interval)")  # fmt: skip
                continue
            state = "interval given" if ci.interval is not None else "too many: no interval"
            notes.append(f"{g['metric']}/{g['segment']}: slope defined in {ci.valid} of {ci.resamples} resamples "
                         f"({state})")  # fmt: skip
    console.print(summary)
    for note in notes:
        console.print(note)
    detail = Table(title="comparisons: ratio online / offline with Fieller's 95 % interval", title_justify="left")
    for col in ("metric", "segment", "experiment", "candidate", "reference", "surface", "ratio [95 %]"):
        detail.add_column(col, justify="right" if col == "ratio [95 %]" else "left")
    for g in doc["groups"]:
        for c in g["comparisons"]:
            ratio = ("offline interval holds 0" if c["ratio"] is None
                     else f"{_num(c['ratio'])} {_interval(c['ratio_ci'])}")  # fmt: skip
            detail.add_row(g["metric"], c["segment"], c["experiment"], c["candidate"], c["reference"], c["surface"],
                           ratio)  # fmt: skip
    console.print(detail)
