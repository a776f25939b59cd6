"""Offline baselines: metrics of an evaluation set per slice, and the baseline file the service loads.

:func:`compute_baseline` turns a validated evaluation set (see :mod:`pipeline.offline.readers`) into one
:class:`pipeline.metrics.aggregates.RankingAggregate` per slice plus the overall slice, with the same kernel the
online path uses. It is vectorised end to end: request ids are numbered once, one stable sort puts every request's
items in rank order (row-wise on a 2-D view for lists of similar length), the AUC histograms come from
value sorts per slice, and the aggregates are built per slice with ``bincount`` -- there is no
per-request Python loop.

Rank order within a request (SPEC section 2): by ``position`` when the column exists, otherwise by
``score`` descending with ties kept in input order. The rank is the place in that order, so positions
1, 2, 5 give ranks 1, 2, 3 (an item missing from the evaluation set does not leave a hole).

Label caps: offline, all requests are known up front, so each label keeps its ``max_values_per_label``
most frequent values (counted in requests; ties by name) and folds the rest into ``"__other__"``;
``label_overflow[label]`` counts the requests folded.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.clock import Clock
from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_groups
from rankwatch.pipeline.metrics.auc import ScoreHistogram
from rankwatch.pipeline.metrics.clusters import request_buckets, score_label_codes
from rankwatch.pipeline.metrics.drift import ScoreDistribution
from rankwatch.pipeline.metrics.gauc import ScoreImage
from rankwatch.pipeline.metrics.kernel import offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.result import result_document
from rankwatch.pipeline.offline.grouping import first_rows
from rankwatch.pipeline.offline.readers import (
    USER_COLUMN,
    EvaluationSet,
    RequestLabels,
    read_evaluation_files,
    validate_evaluation_frame,
)
from rankwatch.pipeline.offline.sorting import rank_order
from rankwatch.pipeline.slicing import OVERFLOW_VALUE, SLICE_LABELS, UNKNOWN_VALUE, SliceKey, SliceSpec

__all__ = [
    "BASELINE_FORMAT",
    "Baseline",
    "BaselineResult",
    "compute_baseline",
    "load_baseline",
    "parse_baseline",
    "rank_order",
    "read_evaluation_files",
    "write_baseline",
]

IntArray = npt.NDArray[np.int64]
BASELINE_FORMAT = "rankwatch-baseline/1"
_COUNT_KEYS = ("requests", "requests_with_relevant", "items")


@dataclass(frozen=True)
class BaselineResult:
    """Metrics of an evaluation set: the overall slice, one aggregate per slice, and where they came from."""

    overall: RankingAggregate
    slices: dict[SliceKey, RankingAggregate]
    options: MetricOptions
    slice_spec: SliceSpec
    inputs: tuple[str, ...] = ()
    rows: int = 0
    skipped_rows: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    label_overflow: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    variant: str | None = None

    def document(self) -> dict[str, Any]:
        """SPEC section 4's result document, plus ``skipped_rows`` and ``label_overflow``."""
        doc = result_document(self.overall, self.slices)
        # issue 13: each slice's score distribution, the reference of the online score-drift statistics
        bins = self.options.drift_bins
        for entry, agg in zip([doc["overall"], *doc["slices"]], [self.overall, *(a for _, a in sorted(self.slices.items()))], strict=True):
            entry["score_distribution"] = ScoreDistribution.from_histogram(agg.histogram, bins).to_dict()
        doc["skipped_rows"] = self.skipped_rows
        doc["label_overflow"] = dict(self.label_overflow)
        return doc


def compute_baseline(
    data: EvaluationSet | pd.DataFrame,
    *,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    skip_invalid: bool = False,
) -> BaselineResult:
    """Per-slice and overall metrics of an evaluation set.

    Parameters
    ----------
    data
        An :class:`EvaluationSet` from :func:`read_evaluation_files`, or a DataFrame with the evaluation
        columns (validated here, rows numbered from 1 in frame order).
    options
        Metric options (cut-offs, gain, MAP normalisation, R = 0 policy); default :class:`MetricOptions`.
    slice_spec
        Labels to slice by and the per-label cap; default segment x surface, 50 values per label.
    skip_invalid
        For a DataFrame: skip and count invalid rows instead of raising
        :class:`pipeline.offline.readers.InvalidEvaluationData`.
    """
    options = options or MetricOptions()
    slice_spec = slice_spec or SliceSpec()
    evalset = data if isinstance(data, EvaluationSet) else validate_evaluation_frame(data, skip_invalid=skip_invalid)
    codes, scores, labels = evalset.request_codes, evalset.scores, evalset.relevance
    lengths = np.bincount(codes, minlength=evalset.n_requests)
    ranked = rank_order(codes, position=evalset.positions, scores=scores, lengths=lengths)
    ranked_labels, ranked_scores = labels[ranked], scores[ranked]
    metrics = per_request_metrics(ranked_labels, offsets_from_lengths(lengths), options)
    gauc_keys = gauc_user_keys(evalset)
    # GAUC runs twice on the same items (overall, per slice): transform and sort their scores once.
    has_gauc = gauc_keys is not None or options.gauc_group == "request"
    relevant = ranked_labels > 0
    # The overall histogram sorts every score once; GAUC's score image reuses its distinct scores.
    overall_hist = ScoreHistogram.from_pairs(ranked_scores, relevant)
    image = ScoreImage.of(ranked_scores, relevant, evalset.n_requests, distinct=overall_hist.scores) if has_gauc else None
    # Both aggregate calls cluster the same items: their buckets and score codes are computed once.
    request_bucket = request_buckets(ranked_scores, metrics.lengths)
    cluster_codes = score_label_codes(ranked_scores, relevant)
    slices: dict[SliceKey, RankingAggregate] = {}
    overflow: dict[str, int] = {}
    if slice_spec.by:
        group, keys, overflow = slice_groups(evalset, slice_spec)
        aggs = aggregate_groups(
            metrics, ranked_labels, ranked_scores, group, len(keys), options, gauc_keys=gauc_keys, score_image=image,
            request_bucket=request_bucket, cluster_codes=cluster_codes,
        )  # fmt: skip
        slices = dict(zip(keys, aggs, strict=True))
    # Integer counts of the overall slice are the sums of the slices' (exact, and no pass over the items).
    overall = aggregate_groups(
        metrics, ranked_labels, ranked_scores, np.zeros(evalset.n_requests, np.int64), 1, options,
        gauc_keys=gauc_keys, score_image=image, positions=not slices, histograms=[overall_hist],
        request_bucket=request_bucket, cluster_codes=cluster_codes,
    )[0]  # fmt: skip
    if slices:
        parts = list(slices.values())
        overall.positives = sum(a.positives for a in parts)
        overall.ctr_shown = np.sum([a.ctr_shown for a in parts], axis=0)
        overall.ctr_positive = np.sum([a.ctr_positive for a in parts], axis=0)
    return BaselineResult(
        overall=overall,
        slices=slices,
        options=options,
        slice_spec=slice_spec,
        inputs=evalset.inputs,
        rows=evalset.rows,
        skipped_rows=evalset.skipped_rows,
        skipped_by_reason=dict(evalset.skipped_by_reason),
        label_overflow=overflow,
        model=_single_value(evalset.labels.get("model")),
        variant=_single_value(evalset.labels.get("variant")),
    )


def gauc_user_keys(evalset: EvaluationSet) -> IntArray | None:
    """Dense GAUC group codes per request from the ``user_id`` column (None without the column).

    A request without a user is a group of its own, as online (:func:`pipeline.stream.join.user_key`).
    """
    users = evalset.labels.get(USER_COLUMN)
    if users is None:
        return None
    keys = users.codes.copy()
    if keys.size and keys.min() < 0:
        missing = np.flatnonzero(keys < 0)
        keys[missing] = len(users.values) + np.arange(missing.size)
    return keys


def slice_groups(evalset: EvaluationSet, spec: SliceSpec) -> tuple[IntArray, list[SliceKey], dict[str, int]]:
    """Slice id of every request, the key of every slice id, and requests folded per label by the cap."""
    n = evalset.n_requests
    combined = np.zeros(n, dtype=np.int64)
    per_label: list[tuple[str, IntArray, list[str]]] = []
    overflow: dict[str, int] = {}
    for label in spec.by:
        found = evalset.labels.get(label) or RequestLabels(np.zeros(n, np.int64), (UNKNOWN_VALUE,))
        codes, values, folded = _cap_label(found, spec.max_values_per_label)
        if folded:
            overflow[label] = folded
        per_label.append((label, codes, values))
        # Re-densify after each label so the mixed-radix code never exceeds n * len(values).
        combined = pd.factorize(combined * len(values) + codes)[0].astype(np.int64)
    group = pd.factorize(combined)[0].astype(np.int64)
    first = first_rows(group)
    keys: list[SliceKey] = [
        tuple((label, values[int(codes[j])]) for label, codes, values in per_label) for j in first
    ]
    return group, keys, overflow


def _cap_label(found: RequestLabels, max_values: int) -> tuple[IntArray, list[str], int]:
    """Keep the most frequent values (ties by name); fold the others into ``__other__``."""
    counts = np.bincount(found.codes, minlength=len(found.values))
    ranked = sorted((i for i in range(len(found.values)) if counts[i] > 0), key=lambda i: (-counts[i], found.values[i]))
    kept, folded_ids = ranked[:max_values], ranked[max_values:]
    values = [found.values[i] for i in kept]
    mapping = np.zeros(len(found.values), dtype=np.int64)
    mapping[kept] = np.arange(len(kept))
    folded = int(counts[folded_ids].sum()) if folded_ids else 0
    if folded:
        mapping[folded_ids] = len(values)
        values.append(OVERFLOW_VALUE)
    return mapping[found.codes], values, folded


def _single_value(found: RequestLabels | None) -> str | None:
    """The label's value when every request has the same known one, else None."""
    if found is None or found.codes.size == 0:
        return None
    present = np.unique(found.codes)
    value = found.values[int(present[0])]
    return value if present.size == 1 and value != UNKNOWN_VALUE else None


# -- baseline files -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Baseline:
    """A loaded baseline file (``rankwatch offline --output FILE``)."""

    created: datetime
    inputs: tuple[str, ...]
    rows: int
    skipped_rows: int
    model: str | None
    variant: str | None
    options: MetricOptions
    slice_by: tuple[str, ...]
    result: dict[str, Any]

    @property
    def overall(self) -> dict[str, Any]:
        overall: dict[str, Any] = self.result["overall"]
        return overall

    @property
    def slices(self) -> dict[SliceKey, dict[str, Any]]:
        """Slice entries keyed like the aggregates, ``(("segment", "x"), ("surface", "y"))``."""
        return {tuple((lbl, str(s[lbl])) for lbl in self.slice_by): s for s in self.result["slices"]}


def baseline_document(result: BaselineResult, *, clock: Clock) -> dict[str, Any]:
    """The baseline file's content: metadata plus the result document."""
    return {
        "format": BASELINE_FORMAT,
        "created": _rfc3339(clock.now()),
        "inputs": list(result.inputs),
        "rows": result.rows,
        "skipped_rows": result.skipped_rows,
        "model": result.model,
        "variant": result.variant,
        "options": result.options.to_dict(),
        "slice_by": list(result.slice_spec.by),
        "result": result.document(),
    }


def write_baseline(path: str | os.PathLike[str], result: BaselineResult, *, clock: Clock) -> dict[str, Any]:
    """Write the baseline file atomically (a reader never sees half a file); returns its content."""
    doc = baseline_document(result, clock=clock)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return doc


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read and validate a baseline file; ``ValueError`` naming the file and the problem if corrupt."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read baseline: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a baseline file: invalid JSON ({e})") from None
    return parse_baseline(doc, source=str(path))


def parse_baseline(doc: Any, *, source: str = "<baseline>") -> Baseline:
    """Validate a decoded baseline document (see :func:`load_baseline`)."""

    def fail(message: str) -> ValueError:
        return ValueError(f"{source}: corrupt baseline: {message}")

    if not isinstance(doc, dict):
        raise fail("top level is not a JSON object")
    if doc.get("format") != BASELINE_FORMAT:
        raise fail(f"format is {doc.get('format')!r}, expected {BASELINE_FORMAT!r}")
    missing = [k for k in _TOP_KEYS if k not in doc]
    if missing:
        raise fail(f"missing key {missing[0]!r}")
    try:
        created = datetime.fromisoformat(str(doc["created"]).replace("Z", "+00:00"))
    except ValueError:
        raise fail(f"created is not an RFC 3339 time: {doc['created']!r}") from None
    if created.tzinfo is None:
        raise fail("created has no time zone")
    if not isinstance(doc["inputs"], list) or not all(isinstance(x, str) for x in doc["inputs"]):
        raise fail("inputs must be a list of strings")
    for key in ("rows", "skipped_rows"):
        if not _is_count(doc[key]):
            raise fail(f"{key} must be a non-negative integer")
    for key in ("model", "variant"):
        if doc[key] is not None and not isinstance(doc[key], str):
            raise fail(f"{key} must be a string or null")
    if not isinstance(doc["options"], dict):
        raise fail("options must be an object")
    try:
        options = MetricOptions.from_dict(doc["options"])
    except (TypeError, ValueError) as e:
        raise fail(f"options: {e}") from None
    slice_by = doc["slice_by"]
    if not isinstance(slice_by, list) or any(s not in SLICE_LABELS for s in slice_by):
        raise fail(f"slice_by must list labels among {', '.join(SLICE_LABELS)}")
    _check_result(doc["result"], options, tuple(slice_by), fail)
    return Baseline(
        created=created.astimezone(UTC),
        inputs=tuple(doc["inputs"]),
        rows=int(doc["rows"]),
        skipped_rows=int(doc["skipped_rows"]),
        model=doc["model"],
        variant=doc["variant"],
        options=options,
        slice_by=tuple(slice_by),
        result=doc["result"],
    )


# Options that change what a metric value means; a baseline computed with other values is not comparable
# with the online windows. ``max_distinct_scores``, ``gauc_max_items``, ``ctr_ranks`` and ``drift_bins`` only
# bound memory or the resolution of a side statistic, so they may differ.
MEANING_OPTIONS = ("ndcg_cutoffs", "map_cutoffs", "gain", "map_normalization", "no_relevant",
                   "precision_cutoffs", "recall_cutoffs", "hit_rate_cutoffs", "gauc_group", "gauc_weight")


def baseline_mismatch(baseline: Baseline, options: MetricOptions, slice_by: tuple[str, ...]) -> str | None:
    """Why ``baseline`` cannot be compared with windows computed with ``options`` and sliced by ``slice_by``.

    Returns ``None`` when it can, else one phrase naming the first differing option, e.g.
    ``"gain is 'linear' in the baseline, 'exponential' in the service"``. The slice labels must be the same
    set, except that a baseline of one variant (top-level ``variant``) need not split on ``variant``.
    """
    mine, theirs = baseline.options.to_dict(), options.to_dict()
    for name in MEANING_OPTIONS:
        if mine[name] != theirs[name]:
            return f"{name} is {mine[name]!r} in the baseline, {theirs[name]!r} in the service"
    wanted = set(slice_by)
    if baseline.variant is not None and "variant" not in baseline.slice_by:
        wanted.discard("variant")
    if set(baseline.slice_by) != wanted:
        return (f"slice_by is {sorted(baseline.slice_by)!r} in the baseline, {sorted(wanted)!r} in the service"
                " (rankwatch offline --by)")
    return None


_TOP_KEYS = ("created", "inputs", "rows", "skipped_rows", "model", "variant", "options", "slice_by", "result")


def _check_result(result: Any, options: MetricOptions, slice_by: tuple[str, ...], fail: Any) -> None:
    if not isinstance(result, dict) or not isinstance(result.get("overall"), dict):
        raise fail("result.overall is missing")
    if not isinstance(result.get("slices"), list):
        raise fail("result.slices must be a list")
    entries = [("result.overall", result["overall"])]
    entries += [(f"result.slices[{i}]", s) for i, s in enumerate(result["slices"])]
    for where, entry in entries:
        if not isinstance(entry, dict):
            raise fail(f"{where} is not an object")
        for key in _COUNT_KEYS:
            if not _is_count(entry.get(key)):
                raise fail(f"{where}.{key} must be a non-negative integer")
        for name in options.metric_names:
            if name not in entry:
                raise fail(f"{where} has no {name!r}")
            value = entry[name]
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            ):
                raise fail(f"{where}.{name} must be a number or null")
        ses = entry.get("stderr")
        if ses is not None:  # absent in files written before issue 11
            if not isinstance(ses, dict):
                raise fail(f"{where}.stderr must be an object")
            for name, se in ses.items():
                if se is not None and (
                    isinstance(se, bool) or not isinstance(se, int | float) or not math.isfinite(se) or se < 0
                ):
                    raise fail(f"{where}.stderr.{name} must be a non-negative number or null")
        if "score_distribution" in entry:
            try:
                ScoreDistribution.from_dict(entry["score_distribution"])
            except (TypeError, ValueError) as e:
                raise fail(f"{where}.score_distribution: {e}") from None
        if where != "result.overall":
            for lbl in slice_by:
                if not isinstance(entry.get(lbl), str):
                    raise fail(f"{where} has no {lbl!r} value")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError("the clock must give timezone-aware times")
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
