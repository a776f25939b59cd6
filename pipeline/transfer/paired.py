"""Paired offline differences: two models scored on the same evaluation requests.

Layout: :class:`PairedDifference` (a mean difference with its standard error over ``n_pairs`` pairs);
:func:`paired_mean` (per-pair differences -> mean and ``sd / sqrt(n)``); :func:`delong_paired` (AUC-ROC of two
score vectors over the same items, DeLong's paired variance); :func:`paired_differences` (an evaluation set
holding both models -> per slice and metric, candidate minus reference).

Why paired: both models rank the same requests, so most of the request-to-request variance is shared and
cancels in the per-request difference; an unpaired comparison of the two baselines (variances added) is
valid but its standard error is several times larger. This is what makes the offline side of a transfer
ledger line precise (SPEC section 7).

Conventions:

- an evaluation set with one row per (model, request, item) is read with the request key
  ``model + "\\x1f" + request_id`` (:func:`model_key`), so each model's list of a request is its own
  request (a request belongs to one model); :func:`split_model_key` recovers the request id;
- a request is paired when both models scored it; its slice is the reference's;
- per-request metrics come from the one kernel (:func:`pipeline.metrics.kernel.per_request_metrics`); a pair
  whose request has no relevant item is left out (``no_relevant = "skip"``) or counts as 0 - 0
  (``"zero"``), as the aggregates do; the standard error of the mean difference is ``sd(d, ddof=1) /
  sqrt(n_pairs)`` (undefined below two pairs);
- AUC-ROC is paired over the items both models scored (same request id and item id, relevance ``label >
  0`` of the reference's row), pooled over the slice's requests like the baseline's AUC; its standard
  error is DeLong's (DeLong, DeLong & Clarke-Pearson 1988) for the difference of two correlated AUCs,
  which treats items as independent (requests are not clusters here; docs/transfer.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.stats import rankdata

from rankwatch.pipeline.metrics.kernel import offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import rank_order, slice_groups
from rankwatch.pipeline.offline.grouping import first_rows
from rankwatch.pipeline.offline.readers import KEY_SEPARATOR, EvaluationSet, model_key, split_model_key
from rankwatch.pipeline.slicing import SliceKey, SliceSpec

__all__ = [
    "KEY_SEPARATOR",
    "PairedDifference",
    "delong_paired",
    "model_key",
    "paired_differences",
    "paired_mean",
    "split_model_key",
]

FloatArray = npt.NDArray[np.float64]
AUC = "auc_roc"


@dataclass(frozen=True)
class PairedDifference:
    """Candidate minus reference over ``n_pairs`` pairs (requests, or items for AUC-ROC).

    ``diff`` is None without pairs, ``stderr`` below two pairs (or, for AUC-ROC, without both a positive
    and a negative item).
    """

    n_pairs: int
    diff: float | None
    stderr: float | None


def paired_mean(d: npt.ArrayLike) -> PairedDifference:
    """Mean of the per-pair differences ``d`` and its standard error ``sd(d, ddof=1) / sqrt(n)``."""
    x = np.asarray(d, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return PairedDifference(0, None, None)
    mean = float(x.mean())
    se = float(np.sqrt(((x - mean) ** 2).sum() / (n - 1) / n)) if n > 1 else None
    return PairedDifference(n, mean, se)


def delong_paired(
    score_candidate: npt.ArrayLike, score_reference: npt.ArrayLike, relevant: npt.ArrayLike
) -> tuple[float | None, float | None, PairedDifference]:
    """AUC-ROC of both score vectors over the same items and DeLong's paired difference (candidate - ref).

    Returns ``(auc_candidate, auc_reference, difference)``; the AUCs are None without both a positive and
    a negative item. Ties count one half (midranks), as in ``sklearn.metrics.roc_auc_score``.
    """
    rel = np.asarray(relevant, dtype=bool)
    scores = np.vstack([np.asarray(score_candidate, np.float64), np.asarray(score_reference, np.float64)])
    m, n = int(rel.sum()), int((~rel).sum())
    if m == 0 or n == 0:
        return None, None, PairedDifference(int(rel.size), None, None)
    v10 = np.empty((2, m))
    v01 = np.empty((2, n))
    for k in range(2):
        s = scores[k]
        pos, neg = s[rel], s[~rel]
        tz = rankdata(s)  # midranks among all items
        v10[k] = (tz[rel] - rankdata(pos)) / n  # share of negatives below each positive (ties 1/2)
        v01[k] = 1.0 - (tz[~rel] - rankdata(neg)) / m  # share of positives above each negative
    auc = v10.mean(axis=1)
    s10 = np.cov(v10) if m > 1 else np.zeros((2, 2))
    s01 = np.cov(v01) if n > 1 else np.zeros((2, 2))
    cov = s10 / m + s01 / n
    var = float(cov[0, 0] + cov[1, 1] - 2.0 * cov[0, 1])
    se = float(np.sqrt(max(var, 0.0))) if m > 1 and n > 1 else None
    return float(auc[0]), float(auc[1]), PairedDifference(int(rel.size), float(auc[0] - auc[1]), se)


def paired_differences(
    evalset: EvaluationSet,
    *,
    candidate: str,
    reference: str,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    label: str = "model",
) -> dict[SliceKey, dict[str, PairedDifference]]:
    """Per slice (``()`` = all) and metric: candidate minus reference over the requests both scored.

    ``evalset`` holds both models' rows, read with :func:`model_key` request ids (``label`` names the
    column carrying the model). Metrics: every per-request metric of ``options`` and ``auc_roc``. Slices
    with no pair are absent.
    """
    options = options or MetricOptions()
    slice_spec = slice_spec or SliceSpec(by=())
    n = evalset.n_requests
    found = evalset.labels.get(label)
    if found is None or n == 0:
        return {}
    model_of = np.array(found.values, dtype=object)[found.codes]
    first = first_rows(evalset.request_codes)
    rids = split_model_key(evalset.frame["request_id"].iloc[first].reset_index(drop=True)).to_numpy(dtype=object)
    cand_codes = np.flatnonzero(model_of == candidate)
    ref_codes = np.flatnonzero(model_of == reference)
    ref_of = pd.Series(ref_codes, index=rids[ref_codes])
    ref_of = ref_of[~ref_of.index.duplicated()]
    matched = ref_of.reindex(rids[cand_codes])
    has = matched.notna().to_numpy()
    pair_c = cand_codes[has]
    pair_r = matched.to_numpy()[has].astype(np.int64)
    if pair_c.size == 0:
        return {}

    ranked = rank_order(evalset.request_codes, position=evalset.positions, scores=evalset.scores)
    lengths = np.bincount(evalset.request_codes, minlength=n)
    metrics = per_request_metrics(evalset.relevance[ranked], offsets_from_lengths(lengths), options)
    if slice_spec.by:
        sgroup, skeys, _overflow = slice_groups(evalset, slice_spec)
    else:
        sgroup, skeys = np.zeros(n, dtype=np.int64), []
    pair_slice = sgroup[pair_r]
    zero = options.no_relevant == "zero"

    item_c, item_r, item_rel = _item_pairs(evalset, rids, pair_c, pair_r)
    item_slice = sgroup[evalset.request_codes[item_r]]

    out: dict[SliceKey, dict[str, PairedDifference]] = {}
    groups: list[tuple[SliceKey, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]] = [
        ((), np.ones(pair_c.size, dtype=bool), np.ones(item_c.size, dtype=bool))
    ]
    groups += [(key, pair_slice == s, item_slice == s) for s, key in enumerate(skeys)]
    for key, in_pairs, in_items in groups:
        if not in_pairs.any():
            continue
        per_metric: dict[str, PairedDifference] = {}
        for name in options.rank_metric_names:
            vc, vr = metrics.values[name][pair_c[in_pairs]], metrics.values[name][pair_r[in_pairs]]
            if zero:
                vc, vr = np.nan_to_num(vc), np.nan_to_num(vr)
            ok = ~(np.isnan(vc) | np.isnan(vr))
            per_metric[name] = paired_mean(vc[ok] - vr[ok])
        _a, _b, auc = delong_paired(evalset.scores[item_c[in_items]], evalset.scores[item_r[in_items]],
                                    item_rel[in_items])  # fmt: skip
        per_metric[AUC] = auc
        out[key] = per_metric
    return out


def _item_pairs(
    evalset: EvaluationSet, rids: npt.NDArray[np.object_], pair_c: npt.NDArray[np.int64], pair_r: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Rows of the items both models scored in paired requests: (candidate rows, reference rows, relevant)."""
    codes = evalset.request_codes
    items = evalset.frame["item_id"].astype(str).to_numpy(dtype=object)
    pair_of_code = np.full(evalset.n_requests, -1, dtype=np.int64)
    pair_of_code[pair_c] = np.arange(pair_c.size)
    side_c = pair_of_code[codes]
    pair_of_code[:] = -1
    pair_of_code[pair_r] = np.arange(pair_r.size)
    side_r = pair_of_code[codes]
    rows_c, rows_r = np.flatnonzero(side_c >= 0), np.flatnonzero(side_r >= 0)
    left = pd.DataFrame({"pair": side_c[rows_c], "item": items[rows_c], "row_c": rows_c})
    right = pd.DataFrame({"pair": side_r[rows_r], "item": items[rows_r], "row_r": rows_r})
    right = right.drop_duplicates(["pair", "item"])
    both = left.drop_duplicates(["pair", "item"]).merge(right, on=["pair", "item"], how="inner")
    row_c = both["row_c"].to_numpy(dtype=np.int64)
    row_r = both["row_r"].to_numpy(dtype=np.int64)
    return row_c, row_r, evalset.relevance[row_r] > 0
